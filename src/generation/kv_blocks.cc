#include "generation/kv_blocks.h"

#include <string>

namespace tandem::gen {

KvBlockAllocator::KvBlockAllocator(int num_blocks, int block_size)
    : total_(num_blocks > 0 ? static_cast<std::uint32_t>(num_blocks) : 0u), block_size_(block_size > 0 ? block_size : 1) {
  free_.reserve(total_);
  for (std::int64_t b = static_cast<std::int64_t>(total_) - 1; b >= 0; --b) free_.push_back(static_cast<std::int32_t>(b));
}

int KvBlockAllocator::blocks_for(std::int64_t tokens) const {
  if (tokens <= 0) return 0;
  return static_cast<int>((tokens + block_size_ - 1) / block_size_);
}

Status KvBlockAllocator::create(SeqId seq) {
  if (!tables_.try_emplace(seq).second)
    return fail(Errc::duplicate, "KV sequence " + std::to_string(seq) + " already exists");
  return {};
}

Status KvBlockAllocator::reserve(SeqId seq, std::int64_t tokens) {
  auto it = tables_.find(seq);
  if (it == tables_.end()) return fail(Errc::not_found, "KV sequence " + std::to_string(seq) + " does not exist");
  auto& table = it->second;
  const int need = blocks_for(tokens);
  const int have = static_cast<int>(table.size());
  if (need <= have) return {};
  const int missing = need - have;
  if (missing > free_blocks())
    return fail(Errc::kv_exhausted, "KV pool exhausted: sequence " + std::to_string(seq) + " needs " +
                                        std::to_string(missing) + " more block(s) for " + std::to_string(tokens) +
                                        " tokens, " + std::to_string(free_blocks()) + " of " +
                                        std::to_string(total_) + " free");
  for (int i = 0; i < missing; ++i) {
    table.push_back(free_.back());
    free_.pop_back();
  }
  return {};
}

int KvBlockAllocator::truncate(SeqId seq, std::int64_t tokens) {
  auto it = tables_.find(seq);
  if (it == tables_.end()) return 0;
  auto& table = it->second;
  const auto keep = static_cast<std::size_t>(blocks_for(tokens));
  int freed = 0;
  while (table.size() > keep) {
    free_.push_back(table.back());
    table.pop_back();
    ++freed;
  }
  return freed;
}

bool KvBlockAllocator::release(SeqId seq) {
  auto it = tables_.find(seq);
  if (it == tables_.end()) return false;
  for (auto b = it->second.rbegin(); b != it->second.rend(); ++b) free_.push_back(*b);
  tables_.erase(it);
  return true;
}

const std::vector<std::int32_t>* KvBlockAllocator::table(SeqId seq) const {
  auto it = tables_.find(seq);
  return it == tables_.end() ? nullptr : &it->second;
}

std::int64_t KvBlockAllocator::capacity_tokens(SeqId seq) const {
  const auto* t = table(seq);
  return t ? static_cast<std::int64_t>(t->size()) * block_size_ : 0;
}

}  // namespace tandem::gen
