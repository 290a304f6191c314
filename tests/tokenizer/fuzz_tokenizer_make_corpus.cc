// Writes the seed corpus of fuzz_tokenizer_json into DIR: tokenizer.json files of generated vocabularies (each pre
// name's regexes, specials, BOS template), a hand-made Llama-2-style file, 'T' texts and 'M' merge lists.
#include <cstdio>
#include <fstream>
#include <string>

#include "tokenizer/bpe_vocab.h"
#include "tokenizer/clip_vocab.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  int n = 0;
  auto put = [&](const std::string& bytes) {
    std::ofstream(dir + "/seed-" + std::to_string(n++), std::ios::binary) << bytes;
  };
  for (const auto& pre : tandem::tok::bpe_pre_names()) {
    put(tandem::tok::hf_json_from_bpe_vocab(
        tandem::tok::generate_bpe_vocab(300, pre, {"<s>", "</s>", "<|im_end|>"}, static_cast<std::uint64_t>(n))));
  }
  put(R"({"added_tokens":[{"id":0,"content":"<unk>","special":true},{"id":1,"content":"<s>","special":true,"lstrip":true}],
"normalizer":{"type":"Sequence","normalizers":[{"type":"Prepend","prepend":"▁"},{"type":"Replace","pattern":{"String":" "},"content":"▁"},{"type":"NFKC"}]},
"pre_tokenizer":{"type":"Sequence","pretokenizers":[{"type":"Digits","individual_digits":true},{"type":"Metaspace","replacement":"▁","prepend_scheme":"first","split":true},{"type":"Split","pattern":{"Regex":"\\s+"},"behavior":"MergedWithPrevious","invert":true}]},
"post_processor":{"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"<s>","type_id":0}},{"Sequence":{"id":"A","type_id":0}}]},
"decoder":{"type":"Sequence","decoders":[{"type":"Replace","pattern":{"String":"▁"},"content":" "},{"type":"ByteFallback"},{"type":"Fuse"},{"type":"Strip","content":" ","start":1,"stop":0}]},
"model":{"type":"BPE","unk_token":"<unk>","byte_fallback":true,"fuse_unk":true,"vocab":{"<unk>":0,"<s>":1,"<0x41>":2,"▁":3,"a":4,"b":5,"▁a":6,"ab":7,"▁ab":8},"merges":["▁ a","a b",["▁","ab"]]}})");
  for (const char* t : {"THello world", "T<|eot_id|> x <|begin_of_text|>", "T\xF0\x9F\x98\x80 12345 caf\xC3\xA9\n\n",
                        "T\xC3\x28 \xFF", "Ma b\nab c\nx y\n"}) {
    put(t);
  }
  // CLIP: texts for the fixed CLIP tokenizer, a vocab.json + merges.txt pair, merges.txt lines alone.
  for (const char* t : {"KA photo of a CAT", "Kit's 2024!!!  \n\t caf\xC3\xA9 \xF0\x9F\x98\x80 <|endoftext|>",
                        "K\xCE\x9F\xCE\x94\xCE\x9F\xCE\xA3 \xC4\xB0"}) {
    put(t);
  }
  const tandem::tok::ClipVocab cv = tandem::tok::train_clip_bpe({"a small red circle on the left", "it's 2024"}, 540);
  put("C" + tandem::tok::clip_vocab_json(cv) + std::string(1, '\0') + tandem::tok::clip_merges_txt(cv));
  put("C#version: 0.2\nr e\nre d</w>\nc a\n");
  std::printf("wrote %d seeds to %s\n", n, dir.c_str());
  return 0;
}
