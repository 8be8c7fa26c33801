// Included first in every source of headgrad's own targets when compiling with GCC < 13 on x86
// (CMakeLists.txt says why): <immintrin.h> with -Wmaybe-uninitialized and -Wuninitialized off, so
// that GCC's false warnings about the deliberately undefined vectors inside its intrinsic headers
// are not reported when those intrinsics are inlined into our code. The include guard makes every
// later inclusion of <immintrin.h> (from Eigen or our kernels) a no-op, so the intrinsics keep the
// source locations that lie inside this push/pop; everything else keeps both warnings.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
