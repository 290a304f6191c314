// Paged KV cache bookkeeping (vLLM-style), independent of where the blocks' storage lives: a pool of fixed-size
// blocks, a block table per sequence, growth block by block, shrinking on a rewind. Exhaustion is a typed result
// (Errc::kv_exhausted), never an exception; growth is all-or-nothing, so a failed grow leaves the sequence exactly as
// it was.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "core/result.h"

namespace tandem::gen {

using SeqId = std::uint64_t;

class KvBlockAllocator {
 public:
  KvBlockAllocator(int num_blocks, int block_size);

  int block_size() const { return block_size_; }
  int total_blocks() const { return static_cast<int>(total_); }
  int free_blocks() const { return static_cast<int>(free_.size()); }
  int used_blocks() const { return total_blocks() - free_blocks(); }
  std::size_t sequences() const { return tables_.size(); }
  int blocks_for(std::int64_t tokens) const;  // ceil(tokens / block_size)

  Status create(SeqId seq);                 // duplicate if it exists
  // Makes room for `tokens` tokens in total (not additional). kv_exhausted when the pool cannot supply the
  // missing blocks; not_found for an unknown sequence.
  Status reserve(SeqId seq, std::int64_t tokens);
  // Keeps the blocks that hold tokens [0, tokens) and returns the rest to the pool (a rewind); the kept blocks keep
  // their places in the table. Returns how many blocks went back (0 for an unknown sequence or nothing to free).
  int truncate(SeqId seq, std::int64_t tokens);
  // Returns all blocks of the sequence to the pool. Idempotent: releasing an unknown sequence does nothing and
  // returns false.
  bool release(SeqId seq);

  const std::vector<std::int32_t>* table(SeqId seq) const;  // nullptr if unknown
  std::int64_t capacity_tokens(SeqId seq) const;            // blocks × block_size, 0 if unknown

 private:
  std::uint32_t total_;
  int block_size_;
  std::vector<std::int32_t> free_;  // LIFO: recently freed blocks are reused first (warm in cache)
  std::unordered_map<SeqId, std::vector<std::int32_t>> tables_;
};

}  // namespace tandem::gen
