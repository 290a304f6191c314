// Writes the seed corpus for fuzz_audio into DIR: small WAVs (16/24-bit, float, stereo, 8 and 44.1 kHz, IMA ADPCM),
// FLAC, Ogg Vorbis, Ogg Opus and MP3, so the fuzzer starts inside each of libsndfile's decoders.
#include <cstdio>
#include <string>

#include "audio_writers.h"

using namespace tandem::audio::testing_writers;

namespace {

bool save(const std::string& dir, const char* name, const Bytes& b) {
  if (b.empty()) return false;
  const std::string path = dir + "/" + name;
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return false;
  const bool ok = std::fwrite(b.data(), 1, b.size(), f) == b.size();
  return std::fclose(f) == 0 && ok;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_audio_make_corpus DIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  const auto s16 = sine(440, 16000, 800);
  std::vector<float> stereo;
  for (float v : s16) stereo.insert(stereo.end(), {v, -v});
  bool ok = true;
  ok &= save(dir, "pcm16.wav", write_audio(SF_FORMAT_WAV | SF_FORMAT_PCM_16, 16000, 1, s16));
  ok &= save(dir, "pcm24.wav", write_audio(SF_FORMAT_WAV | SF_FORMAT_PCM_24, 16000, 1, s16));
  ok &= save(dir, "float.wav", write_audio(SF_FORMAT_WAV | SF_FORMAT_FLOAT, 16000, 1, s16));
  ok &= save(dir, "stereo.wav", write_audio(SF_FORMAT_WAV | SF_FORMAT_PCM_16, 16000, 2, stereo));
  ok &= save(dir, "8k.wav", write_audio(SF_FORMAT_WAV | SF_FORMAT_PCM_16, 8000, 1, sine(440, 8000, 400)));
  ok &= save(dir, "44k.wav", write_audio(SF_FORMAT_WAV | SF_FORMAT_PCM_16, 44100, 1, sine(440, 44100, 2205)));
  ok &= save(dir, "ima.wav", write_audio(SF_FORMAT_WAV | SF_FORMAT_IMA_ADPCM, 16000, 1, s16));
  ok &= save(dir, "pcm16.flac", write_audio(SF_FORMAT_FLAC | SF_FORMAT_PCM_16, 16000, 1, s16));
  ok &= save(dir, "stereo.flac", write_audio(SF_FORMAT_FLAC | SF_FORMAT_PCM_24, 22050, 2, stereo));
  ok &= save(dir, "vorbis.ogg", write_audio(SF_FORMAT_OGG | SF_FORMAT_VORBIS, 16000, 1, s16));
  ok &= save(dir, "opus.opus", write_audio(SF_FORMAT_OGG | SF_FORMAT_OPUS, 16000, 1, s16));
  ok &= save(dir, "mp3.mp3", write_audio(SF_FORMAT_MPEG | SF_FORMAT_MPEG_LAYER_III, 16000, 1, s16));
  ok &= save(dir, "aiff.aiff", write_audio(SF_FORMAT_AIFF | SF_FORMAT_PCM_16, 16000, 1, s16));
  if (!ok) {
    std::fprintf(stderr, "fuzz_audio_make_corpus: cannot write the seeds into %s\n", dir.c_str());
    return 1;
  }
  return 0;
}
