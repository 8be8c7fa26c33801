#pragma once
// The tile sizes of the tiled attention core, and the size below which the op keeps the untiled
// kernel (internal, not installed; self-contained so that tests can include it and set small
// tiles to reach the tile boundaries). attention_flash.cpp holds the one instance.
#include <cstdint>

namespace autograd::sdpa {

struct FlashTiles {
  // Query rows and key columns of one tile.
  std::int64_t block_q = 64;
  std::int64_t block_k = 128;
  // need_weights = false runs the tiled core when T·S is at least this; below, the untiled
  // kernel (faster there). 0: always tile.
  std::int64_t min_tiled_scores = 256 * 256;
};

// The process's tile sizes; tests may change them (not while an attention op runs).
FlashTiles& flash_tiles();

// How many calls have run the tiled core so far (for tests: which core ran).
std::int64_t tiled_calls();
void count_tiled_call();

}  // namespace autograd::sdpa
