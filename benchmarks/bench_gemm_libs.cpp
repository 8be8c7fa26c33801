// Which GEMM should sit behind each class of product headgrad runs: headgrad's own matrix
// product against OpenBLAS, Eigen, BLIS, oneDNN (dnnl_sgemm) and libxsmm (JIT kernels), each
// one that was found at configure time, on the products of a training step of
// nn::MultiHeadAttention at the benchmark shapes and of examples/char_gpt's model.
//
// This one program measures internals: "ours" is autograd::gemm from autograd/src/kernels/gemm.hpp
// (not an installed header), the function every op's product goes through.
//
// For every product: the time of one call (median over samples, the libraries interleaved in
// each sample so that they see the same machine load) and its GFLOP/s, at one thread and at two
// threads; at two threads each library runs once with its own threading and once cut into
// single-threaded pieces the way gemm.cpp cuts a product (rows or columns of C, or K with the
// partial sums added in order), the pieces shared between two OpenMP threads. Then, for every
// library, its error against a float64 reference (in units of K·eps, per element scaled by
// Σ|a||b|) and whether its two-thread results have the same bits as its one-thread result.
// Per-head products run one per thread in headgrad (the batch of heads is shared among the
// threads), so they are timed at one thread only.
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <Eigen/Core>
#include <omp.h>

#include <autograd/autograd.hpp>

#include "bench_common.hpp"
#include "kernels/gemm.hpp"

#ifdef HG_HAVE_OPENBLAS
#include <cblas.h>
#include <dlfcn.h>
#endif
#ifdef HG_HAVE_BLIS
#include <blis.h>
#endif
#ifdef HG_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>
#endif
#ifdef HG_HAVE_XSMM
#include <libxsmm.h>
#endif

// Every heap allocation of the process is counted: these definitions take the place of the C
// allocators for the program and for the shared libraries it loads (operator new calls malloc).
namespace {
std::atomic<std::uint64_t> g_allocations{0};
}  // namespace

extern "C" {
void* __libc_malloc(std::size_t);
void* __libc_calloc(std::size_t, std::size_t);
void* __libc_realloc(void*, std::size_t);
void* __libc_memalign(std::size_t, std::size_t);
void* malloc(std::size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  return __libc_malloc(n);
}
void* calloc(std::size_t n, std::size_t size) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  return __libc_calloc(n, size);
}
void* realloc(void* p, std::size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  return __libc_realloc(p, n);
}
void* aligned_alloc(std::size_t align, std::size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  return __libc_memalign(align, n);
}
void* memalign(std::size_t align, std::size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  return __libc_memalign(align, n);
}
int posix_memalign(void** out, std::size_t align, std::size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  void* p = __libc_memalign(align, n);
  if (p == nullptr && n != 0) return ENOMEM;
  *out = p;
  return 0;
}
}

namespace {

using I = std::int64_t;

// One product C[M, N] = op(A)·op(B), row-major, with the leading dimensions headgrad uses.
struct Product {
  std::string name;  // where it comes from
  bool ta, tb;
  I M, N, K, lda, ldb, ldc;
  bool per_head;  // timed at one thread only
  bool f64;       // also timed in float64
};

std::string op_name(const Product& p) { return std::string(p.ta ? "T" : "N") + (p.tb ? "T" : "N"); }

// Projections of a (rows, in) input by an (in, out) weight (nn::Linear, packed QKV, W_O):
// forward X·W, backward dX = dY·Wᵀ and dW = Xᵀ·dY.
void add_linear(std::vector<Product>& v, const std::string& name, I rows, I in, I out, bool f64) {
  v.push_back({name + " fwd", false, false, rows, out, in, in, out, out, false, f64});
  v.push_back({name + " dX", false, true, rows, in, out, out, out, in, false, f64});
  v.push_back({name + " dW", true, false, in, out, rows, in, out, out, false, f64});
}

// The per-(batch, head) products of attention over T keys, head size d, with Q, K, V (and their
// gradients) read in place from the packed (B·T, 3E) projection and O, dO from (B·T, E).
void add_heads(std::vector<Product>& v, const std::string& name, I T, I d, I E, bool f64) {
  v.push_back({name + " Q·Kᵀ,dO·Vᵀ", false, true, T, T, d, 3 * E, 3 * E, T, true, f64});
  v.push_back({name + " P·V,dS·K", false, false, T, d, T, T, 3 * E, E, true, f64});
  v.push_back({name + " Pᵀ·dO,dSᵀ·Q", true, false, T, d, T, T, E, 3 * E, true, f64});
}

std::vector<Product> products() {
  std::vector<Product> v;
  for (const auto& s : bench::attention_shapes()) {
    if (s.causal) continue;  // the same projections; causal slices cut the per-head products in 32-row blocks
    const I rows = s.B * s.T;
    const bool f64 = s.name == "toy" || s.name == "large";
    add_linear(v, s.name + " qkv", rows, s.E, 3 * s.E, f64);
    add_linear(v, s.name + " out", rows, s.E, s.E, false);
    add_heads(v, s.name, s.T, s.E / s.H, s.E, f64);
  }
  // examples/char_gpt's defaults: batch 12, block 64, n_embd 128, 4 heads, MLP 4·128, vocabulary 65.
  const I rows = 12 * 64, E = 128;
  add_linear(v, "gpt mlp1", rows, E, 4 * E, false);
  add_linear(v, "gpt mlp2", rows, 4 * E, E, false);
  add_linear(v, "gpt head", rows, E, 65, false);
  add_heads(v, "gpt", 64, E / 4, E, false);
  // examples/grokking's full batch: 3,831 training pairs of 3 tokens, d_model 128, MLP 512, p = 113;
  // the keys and values at every position, the rest at the last one only.
  const I pairs = 3831;
  add_linear(v, "grok qkv", 3 * pairs, E, 3 * E, false);
  add_linear(v, "grok out", pairs, E, E, false);
  add_linear(v, "grok mlp1", pairs, E, 4 * E, false);
  add_linear(v, "grok mlp2", pairs, 4 * E, E, false);
  add_linear(v, "grok unembed", pairs, E, 113, false);
  return v;
}

// ---- the libraries: one call C = op(A)·op(B) each, at the thread count they were given ----

template <class T>
using Call = std::function<void(const Product&, const T*, const T*, T*)>;

template <class T>
struct Library {
  std::string name;
  Call<T> call;                         // empty: not available for this type
  std::function<void(int)> threads;     // its own thread count
  std::function<bool(const Product&)> fits = [](const Product&) { return true; };
  bool own_threads = true;              // threads inside one call
};

void all_threads(int n) {  // every library's own count
  omp_set_num_threads(n);
  Eigen::setNbThreads(n);
#ifdef HG_HAVE_OPENBLAS
  openblas_set_num_threads(n);
#endif
#ifdef HG_HAVE_BLIS
  bli_thread_set_num_threads(n);
#endif
}

template <class T>
void eigen_call(const Product& p, const T* A, const T* B, T* C) {
  using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using S = Eigen::OuterStride<>;
  Eigen::Map<Mat, 0, S> c(C, p.M, p.N, S(p.ldc));
  const Eigen::Map<const Mat, 0, S> a(A, p.ta ? p.K : p.M, p.ta ? p.M : p.K, S(p.lda));
  const Eigen::Map<const Mat, 0, S> b(B, p.tb ? p.N : p.K, p.tb ? p.K : p.N, S(p.ldb));
  if (!p.ta && !p.tb) c.noalias() = a * b;
  else if (!p.ta) c.noalias() = a * b.transpose();
  else if (!p.tb) c.noalias() = a.transpose() * b;
  else c.noalias() = a.transpose() * b.transpose();
}

template <class T>
std::vector<Library<T>> libraries() {
  std::vector<Library<T>> v;
  v.push_back({"ours",
               [](const Product& p, const T* A, const T* B, T* C) {
                 autograd::gemm<T>(p.ta, p.tb, p.M, p.N, p.K, T(1), A, p.lda, B, p.ldb, T(0), C, p.ldc);
               },
               [](int n) { autograd::set_num_threads(n); }});
  v.push_back({"Eigen", eigen_call<T>, [](int n) { Eigen::setNbThreads(n); omp_set_num_threads(n); }});
#ifdef HG_HAVE_OPENBLAS
  v.push_back({"OpenBLAS",
               [](const Product& p, const T* A, const T* B, T* C) {
                 const auto ta = p.ta ? CblasTrans : CblasNoTrans, tb = p.tb ? CblasTrans : CblasNoTrans;
                 const auto m = static_cast<blasint>(p.M), n = static_cast<blasint>(p.N), k = static_cast<blasint>(p.K);
                 const auto la = static_cast<blasint>(p.lda), lb = static_cast<blasint>(p.ldb);
                 const auto lc = static_cast<blasint>(p.ldc);
                 if constexpr (std::is_same_v<T, float>) cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, 1.f, A, la, B, lb, 0.f, C, lc);
                 else cblas_dgemm(CblasRowMajor, ta, tb, m, n, k, 1.0, A, la, B, lb, 0.0, C, lc);
               },
               [](int n) { openblas_set_num_threads(n); omp_set_num_threads(n); }});
#endif
#ifdef HG_HAVE_BLIS
  v.push_back({"BLIS",
               [](const Product& p, const T* A, const T* B, T* C) {
                 const trans_t ta = p.ta ? BLIS_TRANSPOSE : BLIS_NO_TRANSPOSE;
                 const trans_t tb = p.tb ? BLIS_TRANSPOSE : BLIS_NO_TRANSPOSE;
                 T one = 1, zero = 0;  // BLIS takes op(A) of m x k stored with strides (rs, cs) of A itself
                 if constexpr (std::is_same_v<T, float>)
                   bli_sgemm(ta, tb, p.M, p.N, p.K, &one, const_cast<T*>(A), p.lda, 1, const_cast<T*>(B), p.ldb, 1,
                             &zero, C, p.ldc, 1);
                 else
                   bli_dgemm(ta, tb, p.M, p.N, p.K, &one, const_cast<T*>(A), p.lda, 1, const_cast<T*>(B), p.ldb, 1,
                             &zero, C, p.ldc, 1);
               },
               [](int n) { bli_thread_set_num_threads(n); }});
#endif
#ifdef HG_HAVE_DNNL
  if constexpr (std::is_same_v<T, float>) {  // oneDNN has sgemm only (no dgemm)
    v.push_back({"oneDNN",
                 [](const Product& p, const T* A, const T* B, T* C) {
                   dnnl_sgemm(p.ta ? 'T' : 'N', p.tb ? 'T' : 'N', p.M, p.N, p.K, 1.f, A, p.lda, B, p.ldb, 0.f, C, p.ldc);
                 },
                 [](int n) { omp_set_num_threads(n); }});
  } else {
    v.push_back({"oneDNN", {}, [](int) {}});
  }
#endif
#ifdef HG_HAVE_XSMM
  // Column-major: Cᵀ[N, M] = op(B)ᵀ·op(A)ᵀ, i.e. B's buffer is the first operand. One kernel per
  // shape, looked up (JIT-generated the first time) on every call, as a gemm() would have to.
  auto dispatch = [](const Product& p) {
    const libxsmm_blasint m = p.N, n = p.M, k = p.K, la = p.ldb, lb = p.lda, lc = p.ldc;
    const int flags = (p.tb ? LIBXSMM_GEMM_FLAG_TRANS_A : 0) | (p.ta ? LIBXSMM_GEMM_FLAG_TRANS_B : 0);
    const T one = 1, zero = 0;
    if constexpr (std::is_same_v<T, float>) return libxsmm_smmdispatch(m, n, k, &la, &lb, &lc, &one, &zero, &flags, nullptr);
    else return libxsmm_dmmdispatch(m, n, k, &la, &lb, &lc, &one, &zero, &flags, nullptr);
  };
  Library<T> x{"libxsmm", [dispatch](const Product& p, const T* A, const T* B, T* C) { dispatch(p)(B, A, C); },
               [](int) {}};
  x.fits = [dispatch](const Product& p) { return dispatch(p) != nullptr; };
  x.own_threads = false;  // a kernel is one thread
  v.push_back(x);
#endif
  return v;
}

// ---- gemm.cpp's cut of a product into single-threaded pieces (the same rule, restated) ----

struct Cut {
  bool by_k = false, by_rows = true;
  I length = 0, step = 0, count = 1;
};

I whole_pieces(I p) { return p >= 4 ? 4 : p >= 2 ? 2 : 1; }

Cut cut_of(I M, I N, I K) {
  constexpr I kPieceWork = I{1} << 19, kPieceMin = 64, kMaxPieces = 4, kPieceMinK = 256;
  Cut c;
  c.by_rows = M >= N;
  const I side = c.by_rows ? M : N, work_pieces = M * N * K / kPieceWork;
  I pieces = whole_pieces(std::min({kMaxPieces, side / kPieceMin, work_pieces}));
  const I k_pieces = whole_pieces(std::min({kMaxPieces, K / kPieceMinK, work_pieces}));
  c.by_k = k_pieces > pieces || (k_pieces > 1 && k_pieces == pieces && K > side);
  if (c.by_k) pieces = k_pieces;
  c.length = c.by_k ? K : side;
  c.step = std::max<I>(((c.length + pieces - 1) / pieces + 15) / 16 * 16, 1);
  c.count = (c.length + c.step - 1) / c.step;
  return c;
}

// C = op(A)·op(B) through `call`, cut as gemm.cpp cuts it, the pieces shared by `threads` threads.
template <class T>
void cut_call(const Call<T>& call, const Product& p, const T* A, const T* B, T* C, int threads,
              std::vector<T>& scratch) {
  const Cut cut = cut_of(p.M, p.N, p.K);
  if (cut.count == 1) {  // one piece: no region (as in gemm.cpp)
    call(p, A, B, C);
    return;
  }
  if (cut.by_k) scratch.resize(static_cast<std::size_t>(std::max<I>(cut.count - 1, 0) * p.M * p.N));
  T* const partial = scratch.data();
#pragma omp parallel num_threads(threads)
  {
#pragma omp for schedule(static)
    for (I i = 0; i < cut.count; ++i) {
      const I lo = i * cut.step, len = std::min(cut.step, cut.length - lo);
      Product q = p;
      if (cut.by_k) {
        q.K = len;
        const T* a = p.ta ? A + lo * p.lda : A + lo;
        const T* b = p.tb ? B + lo : B + lo * p.ldb;
        if (i > 0) q.ldc = p.N;
        call(q, a, b, i == 0 ? C : partial + (i - 1) * p.M * p.N);
      } else if (cut.by_rows) {
        q.M = len;
        call(q, p.ta ? A + lo : A + lo * p.lda, B, C + lo * p.ldc);
      } else {
        q.N = len;
        call(q, A, p.tb ? B + lo * p.ldb : B + lo, C + lo);
      }
    }
    if (cut.by_k) {
#pragma omp for schedule(static)
      for (I r = 0; r < p.M; ++r)
        for (I i = 1; i < cut.count; ++i)
          for (I j = 0; j < p.N; ++j) C[r * p.ldc + j] += partial[(i - 1) * p.M * p.N + r * p.N + j];
    }
  }
}

// ---- measurement ----

template <class T>
struct Operands {
  std::vector<T> A, B, C;
  std::vector<double> ref, scale;  // float64 reference and Σ|a||b| per element
};

template <class T>
Operands<T> operands(const Product& p, std::mt19937_64& rng) {
  Operands<T> o;
  std::uniform_real_distribution<double> u(-1, 1);
  o.A.resize(static_cast<std::size_t>((p.ta ? p.K : p.M) * p.lda));
  o.B.resize(static_cast<std::size_t>((p.tb ? p.N : p.K) * p.ldb));
  o.C.assign(static_cast<std::size_t>(p.M * p.ldc), T(0));
  for (auto& x : o.A) x = static_cast<T>(u(rng));
  for (auto& x : o.B) x = static_cast<T>(u(rng));
  o.ref.assign(static_cast<std::size_t>(p.M * p.N), 0.0);
  o.scale = o.ref;
  for (I i = 0; i < p.M; ++i)
    for (I k = 0; k < p.K; ++k) {
      const double a = o.A[p.ta ? k * p.lda + i : i * p.lda + k];
      for (I j = 0; j < p.N; ++j) {
        const double b = o.B[p.tb ? j * p.ldb + k : k * p.ldb + j];
        o.ref[i * p.N + j] += a * b;
        o.scale[i * p.N + j] += std::abs(a * b);
      }
    }
  return o;
}

// Largest |C - ref| / (Σ|a||b| · K · eps) over the elements of C.
template <class T>
double error_units(const Product& p, const Operands<T>& o, const std::vector<T>& C) {
  double worst = 0;
  const double eps = std::numeric_limits<T>::epsilon() * static_cast<double>(std::max<I>(p.K, 1));
  for (I i = 0; i < p.M; ++i)
    for (I j = 0; j < p.N; ++j) {
      const double e = std::abs(static_cast<double>(C[i * p.ldc + j]) - o.ref[i * p.N + j]);
      const double s = std::max(o.scale[i * p.N + j], 1e-300) * eps;
      worst = std::max(worst, std::isfinite(e) ? e / s : HUGE_VAL);
    }
  return worst;
}

template <class T>
bool same_bits(const Product& p, const std::vector<T>& x, const std::vector<T>& y) {
  for (I i = 0; i < p.M; ++i)
    if (std::memcmp(&x[i * p.ldc], &y[i * p.ldc], sizeof(T) * p.N) != 0) return false;
  return true;
}

struct Settings {
  int samples = 21;
  double min_time = 0.002;
  std::string filter;
  bool f64 = true;
};

// One way of running a library: at `threads`, with its own threading or cut into pieces.
struct Mode {
  const char* name;
  int threads;
  bool cut;
};

template <class T>
struct Runner {
  Library<T>* lib;
  Mode mode;
  std::vector<T> scratch;
  void run(const Product& p, const T* A, const T* B, T* C) {
    if (mode.cut) {
      all_threads(1);
      cut_call(lib->call, p, A, B, C, mode.threads, scratch);
      return;
    }
    all_threads(1);
    lib->threads(mode.threads);
    lib->call(p, A, B, C);
  }
};

// Median seconds per call of each runner, interleaved: every sample times each runner in turn
// (starting one further along each sample), each over enough calls to last min_time (one
// thread: CPU time, two threads: wall-clock time, see seconds()).
// Seconds f() takes: CPU time of the calling thread when `cpu` (one-thread runs: the time the
// thread was off the core while other processes ran is not counted, so a shared machine's load
// moves the figure little), else wall-clock time (two threads: a thread that waits for a core
// slows the call, and that shows).
template <class F>
double seconds(bool cpu, F&& f) {
  auto now = [cpu] {
    timespec t{};
    clock_gettime(cpu ? CLOCK_THREAD_CPUTIME_ID : CLOCK_MONOTONIC, &t);
    return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
  };
  const double t0 = now();
  f();
  return now() - t0;
}

template <class T>
std::vector<double> time_runners(std::vector<Runner<T>>& rs, const Product& p, Operands<T>& o, const Settings& s) {
  const std::size_t n = rs.size(), samples = static_cast<std::size_t>(s.samples);
  std::vector<long> reps(n, 1);
  for (std::size_t r = 0; r < n; ++r) {  // warm up and calibrate on the calling thread's CPU time
    double t = HUGE_VAL;
    for (int i = 0; i < 3; ++i) t = std::min(t, seconds(true, [&] { rs[r].run(p, o.A.data(), o.B.data(), o.C.data()); }));
    reps[r] = std::max(1L, static_cast<long>(s.min_time / std::max(t, 1e-9)));
  }
  std::vector<double> times(n * samples);  // [runner][sample]
  for (std::size_t k = 0; k < samples; ++k)
    for (std::size_t j = 0; j < n; ++j) {
      const std::size_t r = (j + k) % n;
      const double t = seconds(rs[r].mode.threads == 1, [&] {
        for (long i = 0; i < reps[r]; ++i) rs[r].run(p, o.A.data(), o.B.data(), o.C.data());
      });
      times[r * samples + k] = t / static_cast<double>(reps[r]);
    }
  std::vector<double> med(n);
  for (std::size_t r = 0; r < n; ++r) {
    const auto first = times.begin() + static_cast<std::ptrdiff_t>(r * samples);
    std::nth_element(first, first + static_cast<std::ptrdiff_t>(samples / 2), first + static_cast<std::ptrdiff_t>(samples));
    med[r] = first[static_cast<std::ptrdiff_t>(samples / 2)];
  }
  return med;
}

}  // namespace

namespace {

// One product's figures: per mode, per library, seconds per call (0: not run); per library the
// error at one thread and whether two threads (own threading, cut) gave the same bits.
struct Result {
  Product p;
  std::vector<std::vector<double>> secs;  // [mode][library]
  std::vector<double> err;                // [library], < 0: not run
  // [library]: 1 same bits, 0 differ, -1 not run: two threads (own threading) against one; the
  // pieces on two threads against the pieces on one; the pieces against the uncut product.
  std::vector<int> own_same, cut_same, cut_whole;
  std::vector<double> allocs;  // [library]: heap allocations per warm call at one thread
};

const std::vector<Mode>& modes() {
  static const std::vector<Mode> m{{"1 thread", 1, false},
                                   {"2 threads, each library's own threading", 2, false},
                                   {"2 threads, cut into single-threaded pieces as gemm.cpp cuts", 2, true}};
  return m;
}

template <class T>
bool runs(const Library<T>& lib, const Product& p, const Mode& m) {
  if (!lib.call || !lib.fits(p)) return false;
  if (m.threads > 1 && p.per_head) return false;
  if (m.threads > 1 && !m.cut && !lib.own_threads) return false;
  if (m.cut && lib.name == "ours") return false;  // ours cuts by itself (its own threading)
  return true;
}

template <class T>
Result measure(const Product& p, std::vector<Library<T>>& libs, const Settings& s, std::mt19937_64& rng) {
  Operands<T> o = operands<T>(p, rng);
  const std::vector<int> none(libs.size(), -1);
  Result r{p, {}, std::vector<double>(libs.size(), -1), none, none, none, std::vector<double>(libs.size(), 0)};
  std::vector<Runner<T>> rs;
  std::vector<std::pair<std::size_t, std::size_t>> where;  // runner -> (mode, library)
  for (std::size_t m = 0; m < modes().size(); ++m)
    for (std::size_t l = 0; l < libs.size(); ++l)
      if (runs(libs[l], p, modes()[m])) {
        rs.push_back({&libs[l], modes()[m], {}});
        where.emplace_back(m, l);
      }
  // Correctness and bits: C starts as NaN each time (beta = 0 must not read it).
  auto result_of = [&](Runner<T>& run) {
    std::fill(o.C.begin(), o.C.end(), std::numeric_limits<T>::quiet_NaN());
    run.run(p, o.A.data(), o.B.data(), o.C.data());
    return o.C;
  };
  std::vector<std::vector<T>> one(libs.size());
  for (std::size_t i = 0; i < rs.size(); ++i) {
    const auto [m, l] = where[i];
    const std::vector<T> c = result_of(rs[i]);
    if (!modes()[m].cut && modes()[m].threads == 1) {
      one[l] = c;
      r.err[l] = error_units(p, o, c);
    } else if (!modes()[m].cut) {
      r.own_same[l] = !one[l].empty() && same_bits(p, one[l], c) ? 1 : 0;
    } else {  // the pieces on one thread, in order: the same bits, and the same as uncut?
      Runner<T> serial{rs[i].lib, {"", 1, true}, {}};
      const std::vector<T> c1 = result_of(serial);
      r.cut_same[l] = same_bits(p, c1, c) ? 1 : 0;
      r.cut_whole[l] = !one[l].empty() && same_bits(p, one[l], c1) ? 1 : 0;
    }
  }
  for (std::size_t i = 0; i < rs.size(); ++i) {  // allocations per warm one-thread call
    if (modes()[where[i].first].threads != 1) continue;
    constexpr int kCalls = 8;
    rs[i].run(p, o.A.data(), o.B.data(), o.C.data());  // sets every thread count to 1
    const std::uint64_t before = g_allocations.load();
    for (int k = 0; k < kCalls; ++k) rs[i].lib->call(p, o.A.data(), o.B.data(), o.C.data());
    r.allocs[where[i].second] = static_cast<double>(g_allocations.load() - before) / kCalls;
  }
  const std::vector<double> med = time_runners(rs, p, o, s);
  r.secs.assign(modes().size(), std::vector<double>(libs.size(), 0.0));
  for (std::size_t i = 0; i < rs.size(); ++i) r.secs[where[i].first][where[i].second] = med[i];
  all_threads(1);
  return r;
}

double gflops(const Product& p, double secs) {
  return secs > 0 ? 2.0 * static_cast<double>(p.M * p.N * p.K) / secs / 1e9 : 0.0;
}

// One markdown table per mode: time per call (µs) and GFLOP/s of each library, the fastest, by
// how much it beats the runner-up, and ours / fastest.
template <class T>
void print_times(const std::vector<Result>& rs, const std::vector<Library<T>>& libs, const char* type) {
  for (std::size_t m = 0; m < modes().size(); ++m) {
    std::printf("\n### %s, %s: µs per call (GFLOP/s)\n\n| product | op | M×N×K |", type, modes()[m].name);
    for (const auto& l : libs) std::printf(" %s |", l.name.c_str());
    std::printf(" fastest | by | ours/fastest |\n|---|---|---|");
    for (std::size_t l = 0; l < libs.size(); ++l) std::printf("---:|");
    std::printf("---|---:|---:|\n");
    for (const auto& r : rs) {
      const auto& t = r.secs[m];
      std::vector<std::size_t> order;
      for (std::size_t l = 0; l < t.size(); ++l)
        if (t[l] > 0) order.push_back(l);
      if (order.size() < 2) continue;
      std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return t[a] < t[b]; });
      std::printf("| %s | %s | %lld×%lld×%lld |", r.p.name.c_str(), op_name(r.p).c_str(), static_cast<long long>(r.p.M),
                  static_cast<long long>(r.p.N), static_cast<long long>(r.p.K));
      for (std::size_t l = 0; l < t.size(); ++l) {
        if (t[l] > 0) std::printf(" %.3g (%.0f) |", t[l] * 1e6, gflops(r.p, t[l]));
        else std::printf(" – |");
      }
      const double ours = r.secs[m][0] > 0 ? r.secs[m][0] : r.secs[1][0];  // cut mode: ours at 2 threads
      std::printf(" %s | %.2f× | %s |\n", libs[order[0]].name.c_str(), t[order[1]] / t[order[0]],
                  ours > 0 ? fmt::format("{:.2f}×", ours / t[order[0]]).c_str() : "–");
    }
  }
}

// Per library: error in units of K·eps·Σ|a||b| at one thread, then three marks (= same bits, ≠
// differ, – not run): two threads with its own threading against one thread; the pieces on two
// threads against the pieces on one; the pieces against the uncut product; and the heap
// allocations per warm one-thread call when there are any.
template <class T>
int print_checks(const std::vector<Result>& rs, const std::vector<Library<T>>& libs, const char* type) {
  int wrong = 0;
  std::printf("\n### %s checks: error / (K·eps·Σ|a||b|) at 1 thread; same bits? own 2 threads vs 1, "
              "pieces on 2 threads vs on 1, pieces vs uncut; heap allocations per warm 1-thread call\n\n"
              "| product | op |", type);
  for (const auto& l : libs) std::printf(" %s |", l.name.c_str());
  std::printf("\n|---|---|");
  for (std::size_t l = 0; l < libs.size(); ++l) std::printf("---|");
  std::printf("\n");
  auto mark = [](int v) { return v < 0 ? "–" : v ? "=" : "≠"; };
  for (const auto& r : rs) {
    std::printf("| %s | %s |", r.p.name.c_str(), op_name(r.p).c_str());
    for (std::size_t l = 0; l < libs.size(); ++l) {
      if (r.err[l] < 0) {
        std::printf(" – |");
        continue;
      }
      const bool bad = !(r.err[l] <= 1.0);
      wrong += bad;
      std::printf(" %.3f%s %s%s%s", r.err[l], bad ? " WRONG" : "", mark(r.own_same[l]), mark(r.cut_same[l]),
                  mark(r.cut_whole[l]));
      if (r.allocs[l] > 0) std::printf(" %.3g alloc", r.allocs[l]);
      std::printf(" |");
    }
    std::printf("\n");
  }
  return wrong;
}

template <class T>
int run_type(const std::vector<Product>& ps, const Settings& s, const char* type) {
  std::vector<Library<T>> libs = libraries<T>();
  std::mt19937_64 rng(20240601);
  std::vector<Result> rs;
  for (const auto& p : ps) {
    if (!s.filter.empty() && p.name.find(s.filter) == std::string::npos) continue;
    if (std::is_same_v<T, double> && !p.f64) continue;
    std::fprintf(stderr, "%s %s %s\n", type, p.name.c_str(), op_name(p).c_str());
    rs.push_back(measure<T>(p, libs, s, rng));
  }
  print_times(rs, libs, type);
  return print_checks(rs, libs, type);
}

void print_load(const char* when) {
  double load[3] = {0, 0, 0};
  if (getloadavg(load, 3) == 3) std::printf("\n- load average %s: %.2f %.2f %.2f\n", when, load[0], load[1], load[2]);
}

void print_machine() {
  print_load("at the start");
  const bench::PeakEstimate peak = bench::estimate_fp32_peak();
  std::printf("## Machine and libraries\n\n- this program compiled for %s; measured clock %.2f GHz;", peak.kernels_isa.c_str(),
              peak.ghz);
  for (const auto& m : peak.measured) std::printf(" %s FP32 peak %.0f GFLOP/s per core;", m.isa.c_str(), m.gflops);
  std::printf("\n- Eigen %d.%d.%d\n", EIGEN_WORLD_VERSION, EIGEN_MAJOR_VERSION, EIGEN_MINOR_VERSION);
#ifdef HG_HAVE_OPENBLAS
  Dl_info info{};
  dladdr(reinterpret_cast<void*>(&cblas_sgemm), &info);
  std::printf("- OpenBLAS: %s, core %s; cblas_sgemm from %s\n", openblas_get_config(), openblas_get_corename(),
              info.dli_fname != nullptr ? info.dli_fname : "?");
#endif
#ifdef HG_HAVE_BLIS
  std::printf("- BLIS %s, kernels for %s\n", bli_info_get_version_str(), bli_arch_string(bli_arch_query_id()));
#endif
#ifdef HG_HAVE_DNNL
  const dnnl_version_t* v = dnnl_version();
  const dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
  const char* isa_name = isa == dnnl_cpu_isa_avx512_core_amx     ? "avx512_core_amx"
                         : isa == dnnl_cpu_isa_avx512_core_bf16 ? "avx512_core_bf16"
                         : isa == dnnl_cpu_isa_avx512_core_vnni ? "avx512_core_vnni"
                         : isa == dnnl_cpu_isa_avx512_core      ? "avx512_core"
                         : isa == dnnl_cpu_isa_avx2             ? "avx2"
                                                                : "other";
  std::printf("- oneDNN %d.%d.%d, kernels for %s\n", v->major, v->minor, v->patch, isa_name);
#endif
#ifdef HG_HAVE_XSMM
  std::printf("- libxsmm %s, target %s\n", LIBXSMM_VERSION, libxsmm_get_target_arch());
#endif
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Times headgrad's matrix product against the GEMM libraries found at configure time"};
  Settings s;
  app.add_option("--samples", s.samples, "samples per measurement (default 21)")->check(CLI::Range(1, 1 << 20));
  app.add_option("--min-time", s.min_time, "seconds per sample, at least one call (default 0.002)")
      ->check(CLI::PositiveNumber);
  app.add_option("--filter", s.filter, "only products whose name contains this");
  bool no_f64 = false;
  app.add_flag("--no-f64", no_f64, "float32 only");
  CLI11_PARSE(app, argc, argv);
  s.f64 = !no_f64;
#ifdef HG_HAVE_XSMM
  libxsmm_init();
#endif
  print_machine();
  const std::vector<Product> ps = products();
  int wrong = run_type<float>(ps, s, "float32");
  if (s.f64) wrong += run_type<double>(ps, s, "float64");
#ifdef HG_HAVE_XSMM
  libxsmm_finalize();
#endif
  print_load("at the end");
  if (wrong > 0) std::printf("\n%d results outside the error bound: a library was called wrongly\n", wrong);
  return wrong > 0 ? 1 : 0;
}
