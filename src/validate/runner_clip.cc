// tandem-validate runner: the scenario's embedding model (daemon.embedding_preset), written once into the model
// cache at run time — modelgen::write_clip_test_model: deterministic random weights and a CLIP byte-level BPE
// tokenizer trained on captions of coloured shapes (vocab.json, merges.txt, tokenizer.json). Nothing is
// committed; the weights are random, so the run checks routing and replies, not retrieval quality.
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "modelgen/clip_writer.h"
#include "validate/runner_internal.h"

namespace tandem::validate::detail {

Status prepare_embedding_model(Campaign& c) {
  const DaemonSettings& d = c.sc.daemon;
  if (d.embedding_preset.empty()) return {};
  const std::string base = c.opts.model_cache.empty() ? "/tmp/tandem-validate-model" : c.opts.model_cache;
  c.embedding_dir = base + "-" + d.embedding_preset;
  if (exists(c.embedding_dir + "/model.safetensors") && exists(c.embedding_dir + "/vocab.json")) return {};
  auto shape = modelgen::clip_preset(d.embedding_preset);
  if (!shape) return fail(shape.error());
  modelgen::ClipWriteOptions o;
  o.shape = *shape;
  o.seed = 7;
  const std::string tmp = c.embedding_dir + ".tmp." + std::to_string(::getpid());
  if (auto s = modelgen::write_clip_test_model(tmp, o); !s) return fail(s.error());
  if (std::rename(tmp.c_str(), c.embedding_dir.c_str()) != 0 && !exists(c.embedding_dir + "/model.safetensors"))
    return fail(Errc::io_error, "cannot move the embedding model to " + c.embedding_dir + ": " + std::strerror(errno));
  return {};
}

}  // namespace tandem::validate::detail
