// One embedding replica, whatever its family: a CLIP dual encoder (texts and images, engine::ClipModel) or a
// BERT-family text encoder (texts only, engine::BertModel). The embedding entries of EngineBackend hold their CPU and
// GPU replicas as EmbedModels (ReplicaPair<EmbedModel>), so the backend's load, warm-up, run, eviction and listing
// code is one for both. docs/embeddings.md.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/result.h"
#include "device/device.h"
#include "engine/model.h"

namespace tandem::engine {
class ClipModel;
class BertModel;
}  // namespace tandem::engine

namespace tandem::daemon {

enum class EmbedFamily : std::uint8_t { clip, bert };

class EmbedModel {
 public:
  // Load options of one replica (ReplicaPair's replica_options fills them from a [[model]] section).
  struct Options {
    engine::ComputeDType dtype = engine::ComputeDType::auto_;
    int threads = 1;
    std::shared_ptr<device::Device> accelerator;
    std::string revision;
  };
  struct Stats {
    std::uint64_t weight_bytes = 0;
    std::uint64_t accel_weight_bytes = 0;
    std::uint64_t resident_copy_bytes = 0;
  };
  // The shape the estimator and ListModels need.
  struct Shape {
    int dim = 0;             // vector width
    int text_positions = 0;  // tokens per text, specials included
    int vocab = 0;
    int layers = 0;          // every layer the replica runs (both CLIP towers)
    int hidden = 0, intermediate = 0, heads = 0;  // the widest tower's
    int image_size = 0, image_tokens = 0, channels = 0;  // 0: no vision tower
  };

  // Errors: those of the engine's loaders, prefixed by nothing (the caller names the model).
  static Result<std::shared_ptr<EmbedModel>> load(EmbedFamily family, const std::string& path, const Options& o);
  ~EmbedModel();

  EmbedFamily family() const { return family_; }
  Stats stats() const;
  std::string fingerprint() const;
  const Shape& shape() const { return shape_; }
  bool has_images() const { return shape_.image_size > 0; }
  engine::ClipModel* clip() const { return clip_.get(); }
  engine::BertModel* bert() const { return bert_.get(); }

  // ids: complete inputs (the family's specials included). One L2-normalised vector each.
  Result<std::vector<std::vector<float>>> embed_texts(std::span<const std::vector<std::int32_t>> ids,
                                                      const std::atomic<bool>* cancel = nullptr);
  // CLIP only (unsupported for a text encoder).
  Result<std::vector<std::vector<float>>> embed_images(std::span<const std::vector<float>> pixels,
                                                       const std::atomic<bool>* cancel = nullptr);

 private:
  EmbedModel() = default;
  EmbedFamily family_ = EmbedFamily::clip;
  std::shared_ptr<engine::ClipModel> clip_;
  std::shared_ptr<engine::BertModel> bert_;
  Shape shape_;
};

}  // namespace tandem::daemon
