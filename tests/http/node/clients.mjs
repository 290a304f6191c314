// The official OpenAI and Ollama JavaScript clients against tandem-http (tests/http/it_http.sh). Each scenario
// prints one JSON line with what the client saw; the shell test checks it against tandemd (GetJob, ListModels).
// Usage: node clients.mjs BASE_URL SCENARIO [MODEL]
import OpenAI from 'openai';
import { Ollama } from 'ollama';

import fs from 'node:fs';

const [base, scenario, model = 'tiny', file = ''] = process.argv.slice(2);
const openai = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'unused-on-loopback', maxRetries: 0, timeout: 60000 });
const ollama = new Ollama({ host: base });
const out = (o) => console.log(JSON.stringify(o));

const scenarios = {
  async openai_models() {
    const ids = [];
    for await (const m of openai.models.list()) ids.push(m.id);
    out({ ids });
  },
  async openai_chat() {
    const { data, response } = await openai.chat.completions
      .create({ model, messages: [{ role: 'user', content: 'Once upon a time' }], max_tokens: 16, seed: 7, temperature: 0 })
      .withResponse();
    out({ text: data.choices[0].message.content, finish: data.choices[0].finish_reason, usage: data.usage,
          job: Number(response.headers.get('tandem-job')), route: response.headers.get('tandem-route'), tandem: data.tandem });
  },
  async openai_chat_stream() {
    const { data: stream, response } = await openai.chat.completions
      .create({ model, messages: [{ role: 'user', content: 'Once upon a time' }], max_tokens: 24, seed: 7,
                stream: true, stream_options: { include_usage: true } })
      .withResponse();
    let text = '', chunks = 0, usage = null, finish = null;
    for await (const c of stream) {
      if (c.usage) usage = c.usage;
      if (c.choices.length && c.choices[0].delta.content) { text += c.choices[0].delta.content; chunks++; }
      if (c.choices.length && c.choices[0].finish_reason) finish = c.choices[0].finish_reason;
    }
    out({ text, chunks, usage, finish, job: Number(response.headers.get('tandem-job')), route: response.headers.get('tandem-route') });
  },
  async openai_completion() {
    const c = await openai.completions.create({ model, prompt: 'Once upon a time', max_tokens: 12, seed: 3 });
    out({ text: c.choices[0].text, usage: c.usage, job: c.tandem && c.tandem.job });
  },
  async openai_abort() {
    // Abort after the first token: the job must end cancelled in tandemd.
    const ac = new AbortController();
    const { data: stream, response } = await openai.chat.completions
      .create({ model, messages: [{ role: 'user', content: 'Tell a long story' }], max_tokens: 1000, stream: true },
              { signal: ac.signal })
      .withResponse();
    const job = Number(response.headers.get('tandem-job'));
    let got = 0;
    try {
      for await (const c of stream) {
        if (c.choices.length && c.choices[0].delta.content) { got++; if (got >= 2) ac.abort(); }
      }
    } catch (e) { /* AbortError */ }
    out({ job, got });
  },
  async openai_unsupported() {
    try {
      await openai.chat.completions.create({ model, messages: [{ role: 'user', content: 'x' }], n: 2 });
      out({ status: 200 });
    } catch (e) { out({ status: e.status, param: e.param, code: e.code, message: e.message }); }
  },
  async openai_unknown_model() {
    try {
      await openai.chat.completions.create({ model: 'no-such-model', messages: [{ role: 'user', content: 'x' }] });
      out({ status: 200 });
    } catch (e) { out({ status: e.status, code: e.code, type: e.type }); }
  },
  async openai_embed() {
    // The SDK asks for base64 unless told otherwise, and decodes it: the vectors as floats.
    const e = await openai.embeddings.create({ model, input: ['a red square', 'a blue circle'] });
    out({ vectors: e.data.map((d) => Array.from(d.embedding)) });
  },
  async openai_embed_tokens() {
    // Token arrays (the file argument is a JSON array of them), base64 as the SDK asks by default.
    const e = await openai.embeddings.create({ model, input: JSON.parse(file) });
    out({ vectors: e.data.map((d) => Array.from(d.embedding)), usage: e.usage });
  },
  async ollama_embed() {
    const e = await ollama.embed({ model, input: ['a red square', 'a blue circle'] });
    out({ vectors: e.embeddings });
  },
  async openai_transcribe() {
    const t = await openai.audio.transcriptions.create({ file: fs.createReadStream(file), model, temperature: 1.0,
      'tandem.seed': 3, 'tandem.temperature_fallback': 'false' });
    out({ text: t.text, tandem: t.tandem });
  },
  async ollama_version() { out(await ollama.version()); },
  async ollama_tags() { const r = await ollama.list(); out({ names: r.models.map((m) => m.name) }); },
  async ollama_ps() { const r = await ollama.ps(); out({ models: r.models.map((m) => ({ name: m.name, size: m.size, size_vram: m.size_vram })) }); },
  async ollama_show() { const r = await ollama.show({ model }); out({ capabilities: r.capabilities, template: r.template }); },
  async ollama_chat() {
    const r = await ollama.chat({ model, messages: [{ role: 'user', content: 'Once upon a time' }], options: { num_predict: 16, seed: 7, temperature: 0 } });
    out({ text: r.message.content, done: r.done, done_reason: r.done_reason, eval_count: r.eval_count,
          eval_duration: r.eval_duration, job: r.tandem && r.tandem.job });
  },
  async ollama_chat_stream() {
    const s = await ollama.chat({ model, messages: [{ role: 'user', content: 'Once upon a time' }], stream: true, options: { num_predict: 24, seed: 7 } });
    let text = '', last = null, job = 0, route = '';
    for await (const p of s) { text += p.message.content; last = p; if (p.tandem) { job = p.tandem.job; route = p.tandem.route; } }
    out({ text, done: last.done, eval_count: last.eval_count, job, route });
  },
  async ollama_generate() {
    const r = await ollama.generate({ model, prompt: 'Once upon a time', options: { num_predict: 12, seed: 3 } });
    out({ text: r.response, done: r.done, job: r.tandem && r.tandem.job });
  },
};

const run = scenarios[scenario];
if (!run) { console.error(`unknown scenario ${scenario}`); process.exit(2); }
run().catch((e) => { out({ error: String(e && e.message || e), status: e && e.status }); process.exit(1); });
