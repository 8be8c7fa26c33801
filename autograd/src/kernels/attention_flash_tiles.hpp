#pragma once
// The tile sizes of the tiled attention core, and the size below which the op keeps the untiled
// kernel (internal, not installed; self-contained so that tests can include it and set small
// tiles to reach the tile boundaries). attention_flash.cpp holds the one instance.
#include <cstdint>

namespace autograd::sdpa {

struct FlashTiles {
  // Query rows and key columns of one tile. Measured (float32, head dim 64, one thread, one
  // training step at T = 1024, 4096 and 8192 causal, process CPU time): 64 x 256 about 4%
  // faster than 64 x 128, 128 x 128, 128 x 256 and 32 x 256, 64 x 512 within 1-2% of it; a
  // 64 x 256 tile of scores is 64 KiB in float32.
  std::int64_t block_q = 64;
  std::int64_t block_k = 256;
  // need_weights = false runs the tiled core when T·S is at least this; below, the untiled
  // kernel, measured faster there (by 10-20% at T = S = 128..512; even at 1024). 0: always tile.
  std::int64_t min_tiled_scores = 1024 * 1024;
};

// The process's tile sizes; tests may change them (not while an attention op runs).
FlashTiles& flash_tiles();

// How many calls have run the tiled core so far (for tests: which core ran).
std::int64_t tiled_calls();
void count_tiled_call();

}  // namespace autograd::sdpa
