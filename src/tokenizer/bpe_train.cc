// generate_bpe_vocab (bpe_vocab.h): byte-level BPE trained on a deterministic generated corpus.
#include <algorithm>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "tokenizer/bpe_learn.h"
#include "tokenizer/bpe_vocab.h"
#include "tokenizer/unicode.h"

namespace tandem::tok {
namespace {

constexpr int kMaxLearnedMerges = 3000;

struct Rng {
  std::uint64_t s;
  std::uint64_t next() {  // splitmix64
    std::uint64_t z = (s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  std::size_t below(std::size_t n) { return static_cast<std::size_t>(next() % n); }
};

std::string make_corpus(Rng& rng) {
  static const char* kSyll[] = {"th", "e",  "an", "re", "on", "at", "en", "nd", "ti", "es", "or", "te", "of", "ed",
                                "is", "it", "al", "ar", "st", "to", "nt", "ng", "se", "ha", "as", "ou", "io", "le",
                                "ve", "co", "me", "de", "hi", "ri", "ro", "ic", "ne", "ea", "ra", "ce", "li", "ch",
                                "ll", "be", "ma", "si", "om", "ur", "ca", "el", "ta", "la", "ns", "ge", "ly", "ei"};
  static const char* kCommon[] = {"the", "of",   "and", "to",   "in",    "is",   "you", "that",  "it",  "he",
                                  "was", "for",  "on",  "are",  "as",    "with", "his", "they",  "I",   "at",
                                  "be",  "this", "have", "from", "or",   "one",  "had", "by",    "word", "but",
                                  "not", "what", "all", "were", "we",    "when", "your", "can",  "said", "there",
                                  "use", "an",   "each", "which", "she", "do",   "how", "their", "if",  "will"};
  static const char* kCode[] = {"int main() {\n    return 0;\n}\n", "for (int i = 0; i < n; ++i) {\n",
                                "def f(x):\n    return x * 2\n", "if (a == b) { x += 1; }\n",
                                "std::vector<int> v;\n", "print(\"hello, world\")\n", "    // comment\n"};
  static const char* kOther[] = {"caf\xC3\xA9", "na\xC3\xAFve", "\xC3\xBC" "ber", "\xE4\xBD\xA0\xE5\xA5\xBD",
                                 "\xE4\xB8\x96\xE7\x95\x8C", "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E",
                                 "\xF0\x9F\x98\x80", "\xE2\x80\x94", "\xD0\x9F\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82"};
  std::vector<std::string> lexicon;
  for (const char* w : kCommon) lexicon.emplace_back(w);
  for (int k = 0; k < 600; ++k) {
    std::string w;
    const std::size_t n = 1 + rng.below(4);
    for (std::size_t s = 0; s < n; ++s) w += kSyll[rng.below(std::size(kSyll))];
    lexicon.push_back(std::move(w));
  }
  std::string text;
  text.reserve(200000);
  while (text.size() < 160000) {
    const std::size_t kind = rng.below(20);
    if (kind < 14) {  // a sentence
      const std::size_t n = 4 + rng.below(12);
      for (std::size_t k = 0; k < n; ++k) {
        std::string w = lexicon[rng.below(k % 2 == 0 ? 50 : lexicon.size())];
        if (k == 0) w[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(w[0])));
        text += w;
        text += (k + 1 == n) ? (rng.below(4) == 0 ? "? " : ". ") : (rng.below(8) == 0 ? ", " : " ");
      }
      if (rng.below(5) == 0) text += "\n";
    } else if (kind < 16) {
      text += std::to_string(rng.below(100000)) + " ";
    } else if (kind < 18) {
      text += kCode[rng.below(std::size(kCode))];
    } else {
      text += std::string(kOther[rng.below(std::size(kOther))]) + " ";
    }
  }
  return text;
}

bool looks_like(const std::string& s, std::initializer_list<const char*> names) {
  for (const char* n : names) {
    if (s == n) return true;
  }
  return false;
}

}  // namespace

BpeVocab generate_bpe_vocab(int vocab_size, std::string pre, std::vector<std::string> specials, std::uint64_t seed) {
  BpeVocab v;
  v.pre = std::move(pre);
  const int target = std::max(0, vocab_size - static_cast<int>(specials.size()));
  const auto& alpha = detail::ByteAlphabet::get();
  for (int b = 0; b < 256; ++b) v.tokens.push_back(alpha.byte_to_utf8[static_cast<std::size_t>(b)]);
  std::unordered_map<std::string, int> id_of;
  for (int b = 0; b < 256; ++b) id_of.emplace(v.tokens[static_cast<std::size_t>(b)], b);

  // Words of the corpus (pre-tokenized with the pre name's regexes), as byte-token sequences with counts.
  Rng rng{seed ^ 0x5EEDULL};
  std::vector<std::string> words{make_corpus(rng)};
  for (const std::string& r : bpe_pre_regexes(v.pre)) {
    auto re = detail::Regex::compile(r, "pre-tokenizer regex");
    if (!re.ok()) continue;
    std::vector<std::string> next;
    std::vector<std::pair<std::size_t, std::size_t>> m;
    for (const std::string& w : words) {
      m.clear();
      re->find_all(w, m);
      std::size_t at = 0;
      for (auto [b, e] : m) {
        if (b > at) next.push_back(w.substr(at, b - at));
        next.push_back(w.substr(b, e - b));
        at = e;
      }
      if (at < w.size()) next.push_back(w.substr(at));
    }
    words.swap(next);
  }
  std::unordered_map<std::string, std::int64_t> counts;
  for (const std::string& w : words) ++counts[w];
  std::vector<std::pair<std::string, std::int64_t>> sorted(counts.begin(), counts.end());
  std::sort(sorted.begin(), sorted.end());
  std::vector<std::vector<int>> syms;
  std::vector<std::int64_t> freq;
  for (const auto& [w, c] : sorted) {
    std::vector<int> s;
    for (char ch : w) s.push_back(static_cast<unsigned char>(ch));
    syms.push_back(std::move(s));
    freq.push_back(c);
  }

  detail::learn_bpe_merges(syms, freq, v.tokens, id_of, v.merges, static_cast<std::size_t>(std::max(target, 0)), 2,
                           kMaxLearnedMerges);

  // Pseudo-random merges of existing tokens up to the target size.
  Rng fill{seed ^ 0xF111ULL};
  int attempts = 0;
  while (static_cast<int>(v.tokens.size()) < target && attempts < target * 50) {
    ++attempts;
    const std::size_t n = v.tokens.size();
    const std::size_t ia = n > 256 ? 256 + fill.below(n - 256) : fill.below(n);
    const std::size_t b = fill.below(n);
    std::string merged = v.tokens[ia] + v.tokens[b];
    if (merged.size() > 24 || id_of.count(merged) != 0) continue;
    v.merges.emplace_back(v.tokens[ia], v.tokens[b]);
    id_of.emplace(merged, static_cast<int>(n));
    v.tokens.push_back(std::move(merged));
  }
  v.types.assign(v.tokens.size(), PieceType::normal);
  for (const std::string& s : specials) {
    const auto id = static_cast<TokenId>(v.tokens.size());
    v.tokens.push_back(s);
    v.types.push_back(PieceType::control);
    if (v.bos < 0 && looks_like(s, {"<s>", "<|begin_of_text|>", "<|startoftext|>", "<bos>"})) v.bos = id;
    if (v.eos < 0 && looks_like(s, {"</s>", "<|end_of_text|>", "<|endoftext|>", "<eos>"})) v.eos = id;
    if (v.eot < 0 && looks_like(s, {"<|eot_id|>", "<|im_end|>", "<|end|>", "<|eot|>", "<end_of_turn>"})) v.eot = id;
  }
  v.add_bos = v.bos >= 0;
  return v;
}

namespace detail {

std::size_t learn_bpe_merges(std::vector<std::vector<int>>& syms, const std::vector<std::int64_t>& freq,
                             std::vector<std::string>& tokens, std::unordered_map<std::string, int>& id_of,
                             std::vector<std::pair<std::string, std::string>>& merges, std::size_t target_tokens,
                             std::int64_t min_count, std::size_t max_merges) {
  // Pair counts, the words holding each pair, a lazy max-heap (count, then the lower pair).
  auto key = [](int a, int b) { return (static_cast<std::uint64_t>(a) << 32) | static_cast<std::uint32_t>(b); };
  std::unordered_map<std::uint64_t, std::int64_t> pair_count;
  std::unordered_map<std::uint64_t, std::vector<int>> pair_words;
  using Entry = std::pair<std::int64_t, std::uint64_t>;
  auto cmp = [](const Entry& x, const Entry& y) { return x.first != y.first ? x.first < y.first : x.second > y.second; };
  std::priority_queue<Entry, std::vector<Entry>, decltype(cmp)> heap(cmp);
  auto add_word = [&](int w, int sign) {
    const auto& s = syms[static_cast<std::size_t>(w)];
    for (std::size_t k = 0; k + 1 < s.size(); ++k) {
      const std::uint64_t kk = key(s[k], s[k + 1]);
      auto& c = pair_count[kk];
      c += sign * freq[static_cast<std::size_t>(w)];
      if (sign > 0) pair_words[kk].push_back(w);
      if (c > 0) heap.push({c, kk});
    }
  };
  for (int w = 0; w < static_cast<int>(syms.size()); ++w) add_word(w, +1);
  std::vector<int> seen(syms.size(), -1);
  std::size_t learned = 0;
  while (tokens.size() < target_tokens && learned < max_merges && !heap.empty()) {
    const auto [count, kk] = heap.top();
    heap.pop();
    const auto it = pair_count.find(kk);
    if (it == pair_count.end() || it->second != count) continue;
    if (count < min_count) break;  // the heap's top: no pair occurs often enough
    const int a = static_cast<int>(kk >> 32);
    const int b = static_cast<int>(kk & 0xFFFFFFFFu);
    std::string merged = tokens[static_cast<std::size_t>(a)] + tokens[static_cast<std::size_t>(b)];
    if (id_of.count(merged) != 0) {  // already a token by another path: never merge this pair again
      it->second = -1;
      continue;
    }
    const int id = static_cast<int>(tokens.size());
    merges.emplace_back(tokens[static_cast<std::size_t>(a)], tokens[static_cast<std::size_t>(b)]);
    id_of.emplace(merged, id);
    tokens.push_back(std::move(merged));
    ++learned;
    const std::vector<int> holders = pair_words[kk];
    for (int w : holders) {
      if (seen[static_cast<std::size_t>(w)] == id) continue;
      seen[static_cast<std::size_t>(w)] = id;
      auto& s = syms[static_cast<std::size_t>(w)];
      bool has = false;
      for (std::size_t k = 0; k + 1 < s.size() && !has; ++k) has = s[k] == a && s[k + 1] == b;
      if (!has) continue;  // the word lost the pair to an earlier merge
      add_word(w, -1);
      std::vector<int> t;
      for (std::size_t k = 0; k < s.size(); ++k) {
        if (k + 1 < s.size() && s[k] == a && s[k + 1] == b) {
          t.push_back(id);
          ++k;
        } else {
          t.push_back(s[k]);
        }
      }
      s.swap(t);
      add_word(w, +1);
    }
  }
  return learned;
}

}  // namespace detail

}  // namespace tandem::tok
