// The driver of bench/http/gateway.sh (read that script's header first). It talks to tandem-http with Node's own
// http module (a keep-alive Agent, SSE parsed by hand: no client library's CPU in the figures) and to tandemd through
// the ring path with the existing native client, `tandemctl --json run --chat` (one ring session per process), whose
// flushed JSON lines are timestamped here on arrival. Only 127.0.0.1 is ever contacted; every loop is bounded in count
// and in time. Prints the figures and one table; --json-out FILE also writes them as JSON.
//   node gateway.mjs --base http://127.0.0.1:PORT --tandemctl PATH --bus ADDR --http-pid N --daemon-pid N
//        [--tokens 64] [--streams 64] [--reps 9] [--duration 5] [--concurrency 8] [--seed 7] [--prompt TEXT]
//        [--rounds 2] [--clk-tck 100] [--bench-streams PATH --route gpu|cpu] [--json-out FILE]
import http from 'node:http';
import { spawn, execFile } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { performance } from 'node:perf_hooks';

const opt = {
  base: '', tandemctl: '', bus: '', httpPid: 0, daemonPid: 0, tokens: 64, streams: 64, reps: 9, duration: 5,
  concurrency: 8, seed: 7, prompt: 'Once upon a time', clkTck: 100, benchStreams: '', route: 'gpu', jsonOut: '',
  maxRequests: 200000, rounds: 2,
};
for (let i = 2; i + 1 < process.argv.length; i += 2) {
  const k = process.argv[i].replace(/^--/, '').replace(/-([a-z])/g, (_, c) => c.toUpperCase());
  if (!(k in opt)) { console.error(`gateway.mjs: unknown flag ${process.argv[i]}`); process.exit(2); }
  opt[k] = typeof opt[k] === 'number' ? Number(process.argv[i + 1]) : process.argv[i + 1];
}
const url = new URL(opt.base);
if (url.hostname !== '127.0.0.1') { console.error(`gateway.mjs: only 127.0.0.1 is measured, not ${url.hostname}`); process.exit(2); }
const PORT = Number(url.port);
const now = () => performance.now();  // ms, monotonic, sub-µs resolution

// --- small statistics -------------------------------------------------------------------------------------------
const sorted = (v) => [...v].sort((a, b) => a - b);
const pct = (v, p) => { if (!v.length) return NaN; const s = sorted(v); return s[Math.min(s.length - 1, Math.round(p * (s.length - 1)))]; };
const median = (v) => pct(v, 0.5);
const sum = (v) => v.reduce((a, b) => a + b, 0);
const f = (x, d = 1) => (Number.isFinite(x) ? x.toFixed(d) : 'n/a');

// --- /proc ------------------------------------------------------------------------------------------------------
function cpuMs(pid) {  // utime + stime of a process, ms
  const s = readFileSync(`/proc/${pid}/stat`, 'utf8');
  const fields = s.slice(s.lastIndexOf(')') + 2).split(' ');  // fields[0] is field 3 (state)
  return ((Number(fields[11]) + Number(fields[12])) * 1000) / opt.clkTck;  // fields 14, 15
}
function childrenCpuMs() {  // cutime + cstime of this process: the tandemctl children it has reaped
  const s = readFileSync('/proc/self/stat', 'utf8');
  const fields = s.slice(s.lastIndexOf(')') + 2).split(' ');
  return ((Number(fields[13]) + Number(fields[14])) * 1000) / opt.clkTck;  // fields 16, 17
}
function memKiB(pid) {
  const s = readFileSync(`/proc/${pid}/status`, 'utf8');
  const get = (k) => Number((s.match(new RegExp(`^${k}:\\s+(\\d+) kB`, 'm')) || [])[1]);
  return { rss: get('VmRSS'), hwm: get('VmHWM') };
}
const selfCpuMs = () => { const u = process.cpuUsage(); return (u.user + u.system) / 1000; };

// --- the gateway: one streamed chat completion ------------------------------------------------------------------
function chatBody(maxTokens, stream) {
  const b = { model: 'default', messages: [{ role: 'user', content: opt.prompt }], max_tokens: maxTokens,
              seed: opt.seed, temperature: 0 };
  if (stream) { b.stream = true; b.stream_options = { include_usage: true }; }
  return JSON.stringify(b);
}

function gwStream(agent, maxTokens) {
  return new Promise((resolve, reject) => {
    const body = chatBody(maxTokens, true);
    const r = { t0: now(), tHeaders: NaN, chunks: [], text: '', usage: null, route: '', job: 0, status: 0, error: '' };
    const req = http.request({ host: '127.0.0.1', port: PORT, path: '/v1/chat/completions', method: 'POST', agent,
                               headers: { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(body) } });
    const deadline = setTimeout(() => req.destroy(new Error('stream took over 300 s')), 300000);
    req.on('response', (res) => {
      r.tHeaders = now();
      r.status = res.statusCode;
      r.route = res.headers['tandem-route'] || '';
      r.job = Number(res.headers['tandem-job'] || 0);
      res.setEncoding('utf8');
      let buf = '';
      res.on('data', (d) => {
        const t = now();
        buf += d;
        let i;
        while ((i = buf.indexOf('\n\n')) >= 0) {
          const ev = buf.slice(0, i);
          buf = buf.slice(i + 2);
          for (const line of ev.split('\n')) {
            if (!line.startsWith('data: ')) continue;
            const data = line.slice(6);
            if (data === '[DONE]') continue;
            const j = JSON.parse(data);
            if (j.error) r.error = JSON.stringify(j.error);
            if (j.usage) r.usage = j.usage;
            const c = j.choices && j.choices[0] && j.choices[0].delta && j.choices[0].delta.content;
            if (c) { r.chunks.push(t); r.text += c; }
          }
        }
      });
      res.on('end', () => { clearTimeout(deadline); resolve(r); });
      res.on('error', (e) => { clearTimeout(deadline); reject(e); });
    });
    req.on('error', (e) => { clearTimeout(deadline); reject(e); });
    req.end(body);
  });
}

// --- the ring path: tandemctl --json run --chat (one process, one ring session) ---------------------------------
function ringStream(maxTokens) {
  return new Promise((resolve, reject) => {
    const r = { t0: now(), tAccepted: NaN, chunks: [], chunkTokens: [], text: '', tokens: 0, route: '', job: 0,
                state: '', noRing: false, viaGetJob: false, stderr: '' };
    const p = spawn(opt.tandemctl, ['--address', opt.bus, '--json', 'run', '--chat', '--max-tokens', String(maxTokens),
                                     '--seed', String(opt.seed), '--temperature', '0', '--timeout', '300', opt.prompt],
                    { env: { ...process.env, TANDEMCTL_DEBUG: '1' }, stdio: ['ignore', 'pipe', 'pipe'] });
    let buf = '';
    p.stdout.setEncoding('utf8');
    p.stdout.on('data', (d) => {
      const t = now();
      buf += d;
      let i;
      while ((i = buf.indexOf('\n')) >= 0) {
        const line = buf.slice(0, i);
        buf = buf.slice(i + 1);
        if (!line) continue;
        const j = JSON.parse(line);
        if (j.event === 'submitted') { r.tAccepted = t; r.job = j.job; r.route = j.placement && j.placement.route; }
        else if (j.event === 'update' && j.kind === 'tokens') {
          if (j.source === 'GetJob') r.viaGetJob = true;
          const n = Array.isArray(j.tokens) ? j.tokens.length : 0;
          if (n > 0 || j.text) { r.chunks.push(t); r.chunkTokens.push(Math.max(n, 1)); r.text += j.text || ''; }
        } else if (j.event === 'update' && (j.kind === 'started' || j.kind === 'routed') && j.route) r.route = j.route;
        else if (j.event === 'summary') { r.tokens = j.tokens; r.state = j.state; }
      }
    });
    p.stderr.setEncoding('utf8');
    p.stderr.on('data', (d) => { r.stderr += d; if (d.includes('no ring session')) r.noRing = true; });
    p.on('error', reject);
    p.on('close', (code) => {
      if (code !== 0) return reject(new Error(`tandemctl exited ${code}: ${r.stderr.slice(0, 400)}`));
      resolve(r);
    });
  });
}

// Inter-token gaps of one stream (ms): a chunk carrying k tokens counts as k equal gaps (bench_streams' rule).
// The gateway's SSE chunks do not say how many tokens they carry: k = the stream's tokens / chunks (1 when equal).
function gaps(chunks, perChunk) {
  const out = [];
  for (let i = 1; i < chunks.length; i++) {
    const k = perChunk[i];
    for (let j = 0; j < k; j++) out.push((chunks[i] - chunks[i - 1]) / k);
  }
  return out;
}
const gwPerChunk = (r) => { const k = r.usage ? r.usage.completion_tokens / Math.max(1, r.chunks.length) : 1; return r.chunks.map(() => k); };
// Decode rate of one stream: the tokens after the first over first → last token (both paths the same way).
const decodeTps = (chunks, tokens) => (tokens - 1) / ((chunks[chunks.length - 1] - chunks[0]) / 1000);

function checkGw(r, what) {
  if (r.status !== 200 || r.error || !r.usage) throw new Error(`${what}: HTTP ${r.status} ${r.error} (no usage chunk: ${!r.usage})`);
}
function checkRing(r, what) {
  if (r.noRing) throw new Error(`${what}: tandemctl fell back to D-Bus (no ring session): ${r.stderr.slice(0, 300)}`);
  if (r.state !== 'completed') throw new Error(`${what}: job ${r.job} ${r.state}: ${r.stderr.slice(0, 300)}`);
}

const results = { options: opt };
const log = (s) => process.stdout.write(s + '\n');

// --- 1. one stream: TTFT and decode tokens/s ---------------------------------------------------------------------
async function partOne() {
  const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
  await gwStream(agent, 8); await ringStream(8);  // warm-up (connection, page cache, the daemon's rates)
  const gw = [], ring = [];
  for (let i = 0; i < opt.reps; i++) {  // interleaved, so drift (a background build) hits both alike
    const g = await gwStream(agent, opt.tokens); checkGw(g, 'gateway stream'); gw.push(g);
    const r = await ringStream(opt.tokens); checkRing(r, 'ring stream'); ring.push(r);
  }
  // Back to back: the same streams one right after the other on one keep-alive connection, no pause between them
  // (a client streaming repeatedly; the interleaved runs above leave the connection idle ~0.1 s between requests).
  const b2b = [];
  for (let i = 0; i < opt.reps; i++) { const g = await gwStream(agent, opt.tokens); checkGw(g, 'gateway stream'); b2b.push(g); }
  agent.destroy();
  const o = {
    gw_b2b_ttft_ms: median(b2b.map((r) => r.chunks[0] - r.t0)),
    gw_b2b_after_accept_ms: median(b2b.map((r) => r.chunks[0] - r.tHeaders)),
    gw_b2b_ttft_all: b2b.map((r) => r.chunks[0] - r.t0),
    gw_ttft_ms: median(gw.map((r) => r.chunks[0] - r.t0)),
    gw_accept_ms: median(gw.map((r) => r.tHeaders - r.t0)),
    gw_after_accept_ms: median(gw.map((r) => r.chunks[0] - r.tHeaders)),
    gw_decode_tps: median(gw.map((r) => decodeTps(r.chunks, r.usage.completion_tokens))),
    gw_accept_to_last_ms: median(gw.map((r) => r.chunks[r.chunks.length - 1] - r.tHeaders)),
    gw_ttft_all: gw.map((r) => r.chunks[0] - r.t0),
    gw_tokens: gw[0].usage.completion_tokens, gw_chunks: gw[0].chunks.length, gw_route: gw[0].route,
    gw_prompt_tokens: gw[0].usage.prompt_tokens,
    ring_spawn_to_first_ms: median(ring.map((r) => r.chunks[0] - r.t0)),
    ring_after_accept_ms: median(ring.map((r) => r.chunks[0] - r.tAccepted)),
    ring_decode_tps: median(ring.map((r) => decodeTps(r.chunks, r.tokens))),
    ring_accept_to_last_ms: median(ring.map((r) => r.chunks[r.chunks.length - 1] - r.tAccepted)),
    ring_after_accept_all: ring.map((r) => r.chunks[0] - r.tAccepted),
    ring_tokens: ring[0].tokens, ring_route: ring[0].route,
    same_text: gw.every((g) => g.text === gw[0].text) && ring.every((r) => r.text === gw[0].text),
  };
  // tandemctl cannot show when it submits (it opens its bus connection and ring session first, ~tens of ms of
  // process start that no gateway client pays), only when the job was accepted. So the ring's TTFT is taken as the
  // gateway's own request → accepted plus the ring's accepted → first token: the comparable part is after acceptance.
  o.ring_ttft_est_ms = o.gw_accept_ms + o.ring_after_accept_ms;
  results.one = o;
  log(`\n1. one stream, ${opt.tokens} tokens, greedy, seed ${opt.seed}, median of ${opt.reps} (interleaved)`);
  log(`   gateway: TTFT ${f(o.gw_ttft_ms, 2)} ms (request → headers at acceptance ${f(o.gw_accept_ms, 2)} ms, then ` +
      `${f(o.gw_after_accept_ms, 2)} ms to the first content chunk), decode ${f(o.gw_decode_tps)} tok/s ` +
      `(${o.gw_tokens} tokens in ${o.gw_chunks} chunks, prompt ${o.gw_prompt_tokens} tokens, route ${o.gw_route})`);
  log(`   ring:    accepted → first token ${f(o.ring_after_accept_ms, 2)} ms (spawn → first token ${f(o.ring_spawn_to_first_ms, 1)} ms), ` +
      `decode ${f(o.ring_decode_tps)} tok/s (${o.ring_tokens} tokens, route ${o.ring_route})`);
  log(`   accepted → last token: gateway ${f(o.gw_accept_to_last_ms, 1)} ms, ring ${f(o.ring_accept_to_last_ms, 1)} ms`);
  log(`   each run: gateway TTFT ${o.gw_ttft_all.map((x) => f(x, 1)).join(' ')} ms; ring accepted → first token ` +
      `${o.ring_after_accept_all.map((x) => f(x, 1)).join(' ')} ms`);
  log(`   gateway back to back (no pause between requests): TTFT ${f(o.gw_b2b_ttft_ms, 2)} ms (accepted → first chunk ` +
      `${f(o.gw_b2b_after_accept_ms, 2)} ms); each run ${o.gw_b2b_ttft_all.map((x) => f(x, 1)).join(' ')} ms`);
  log(`   same text on both paths: ${o.same_text ? 'yes' : 'NO'}`);
}

// --- 2. N concurrent streams ----------------------------------------------------------------------------------
function concurrentSummary(rs, getTokens, getPerChunk, t0, getAccepted) {
  const tokens = sum(rs.map(getTokens));
  const last = Math.max(...rs.map((r) => r.chunks[r.chunks.length - 1]));
  const acc = rs.map(getAccepted);
  const g = rs.flatMap((r) => gaps(r.chunks, getPerChunk(r)));
  return {
    tokens, wall_ms: last - t0, agg_tps: tokens / ((last - t0) / 1000),
    agg_tps_from_accept: tokens / ((last - Math.min(...acc)) / 1000),
    accept_spread_ms: Math.max(...acc) - Math.min(...acc),
    p50_gap_ms: pct(g, 0.5), p95_gap_ms: pct(g, 0.95),
    ttft_p50_ms: pct(rs.map((r) => r.chunks[0] - t0), 0.5),
  };
}

async function gwRound(n) {
  // Gateway: N keep-alive connections, all requests sent at once.
  const agent = new http.Agent({ keepAlive: true, maxSockets: n });
  await Promise.all(Array.from({ length: Math.min(n, 8) }, () => gwStream(agent, 2)));  // warm-up
  const http0 = { cpu: cpuMs(opt.httpPid), mem: memKiB(opt.httpPid) };
  const d0 = cpuMs(opt.daemonPid), s0 = selfCpuMs();
  const t0 = now();
  const gw = await Promise.all(Array.from({ length: n }, () => gwStream(agent, opt.tokens)));
  const http1 = { cpu: cpuMs(opt.httpPid), mem: memKiB(opt.httpPid) };
  const d1 = cpuMs(opt.daemonPid), s1 = selfCpuMs();
  agent.destroy();
  gw.forEach((r) => checkGw(r, 'gateway concurrent stream'));
  const G = concurrentSummary(gw, (r) => r.usage.completion_tokens, gwPerChunk, t0, (r) => r.tHeaders);
  G.chunks = sum(gw.map((r) => r.chunks.length));
  G.routes = [...new Set(gw.map((r) => r.route))].join(',');
  G.daemon_cpu_ms = d1 - d0; G.node_cpu_ms = s1 - s0;
  G.http = { cpu_ms: http1.cpu - http0.cpu, rss_before_kib: http0.mem.rss, rss_after_kib: http1.mem.rss, hwm_kib: http1.mem.hwm };
  return G;
}

async function ringRound(n) {
  // Ring: N tandemctl processes (N ring sessions) spawned at once.
  const c0 = childrenCpuMs(), rd0 = cpuMs(opt.daemonPid), rs0 = selfCpuMs();
  const t1 = now();
  const ring = await Promise.all(Array.from({ length: n }, () => ringStream(opt.tokens)));
  const c1 = childrenCpuMs(), rd1 = cpuMs(opt.daemonPid), rs1 = selfCpuMs();
  ring.forEach((r) => checkRing(r, 'ring concurrent stream'));
  const R = concurrentSummary(ring, (r) => r.tokens, (r) => r.chunkTokens, t1, (r) => r.tAccepted);
  R.chunks = sum(ring.map((r) => r.chunks.length));
  R.routes = [...new Set(ring.map((r) => r.route))].join(',');
  R.daemon_cpu_ms = rd1 - rd0; R.node_cpu_ms = rs1 - rs0; R.tandemctl_cpu_ms = c1 - c0;
  R.via_getjob = ring.filter((r) => r.viaGetJob).length;
  return R;
}

async function partTwo() {
  const n = opt.streams;
  // Rounds in ABBA order (gateway, ring, ring, gateway, ...), so a linear drift of the machine's load hits both alike;
  // each side's figures are those of its best round by aggregate tokens/s (interference from other processes only
  // slows a round down). CPU and memory of tandem-http: over all its rounds.
  const gws = [], rings = [];
  for (let i = 0; i < opt.rounds; i++) {
    if (i % 2 === 0) { gws.push(await gwRound(n)); rings.push(await ringRound(n)); }
    else { rings.push(await ringRound(n)); gws.push(await gwRound(n)); }
  }
  const best = (xs) => xs.reduce((a, b) => (b.agg_tps_from_accept > a.agg_tps_from_accept ? b : a));
  const G = { ...best(gws) }, R = { ...best(rings) };
  const tokensAll = sum(gws.map((g) => g.tokens));
  G.http = {
    cpu_ms: sum(gws.map((g) => g.http.cpu_ms)), tokens: tokensAll, rss_before_kib: gws[0].http.rss_before_kib,
    rss_after_kib: gws[gws.length - 1].http.rss_after_kib, hwm_kib: Math.max(...gws.map((g) => g.http.hwm_kib)),
  };
  G.http.cpu_ms_per_1k = G.http.cpu_ms / (tokensAll / 1000);
  results.many = { gw: G, ring: R, gw_rounds: gws, ring_rounds: rings };
  log(`\n2. ${n} concurrent streams, ${opt.tokens} tokens each, all started at once; ${opt.rounds} round(s) each (ABBA), best shown`);
  log(`   aggregate tok/s from the first acceptance, each round: gateway ${gws.map((x) => f(x.agg_tps_from_accept)).join(' ')}; ` +
      `ring ${rings.map((x) => f(x.agg_tps_from_accept)).join(' ')}`);
  for (const [name, x, extra] of [['gateway', G, `${n} keep-alive connections`],
                                  ['ring', R, `${n} tandemctl processes = ${n} ring sessions`]]) {
    log(`   ${name.padEnd(7)}: ${x.tokens} tokens (${x.chunks} chunks) in ${f(x.wall_ms, 0)} ms → ${f(x.agg_tps)} tok/s ` +
        `from the start (${f(x.agg_tps_from_accept)} tok/s from the first acceptance; acceptances spread over ` +
        `${f(x.accept_spread_ms, 0)} ms), gap p50 ${f(x.p50_gap_ms, 2)} / p95 ${f(x.p95_gap_ms, 2)} ms, ` +
        `TTFT p50 ${f(x.ttft_p50_ms, 1)} ms, route ${x.routes}; ${extra}`);
  }
  const lost = sum(rings.map((r) => r.via_getjob));
  if (lost) log(`   note: ${lost} ring streams lost ring tokens and finished through GetJob polling`);
}

// --- 4. requests/s with a keep-alive client -----------------------------------------------------------------------
async function rps(method, path, body, seconds, conc, maxCount) {
  const agent = new http.Agent({ keepAlive: true, maxSockets: conc });
  let done = 0, ok = 0, started = 0;
  const lat = [];
  const t0 = now(), end = t0 + seconds * 1000;
  const one = () => new Promise((resolve) => {
    const t = now();
    const req = http.request({ host: '127.0.0.1', port: PORT, path, method, agent,
                               headers: body ? { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(body) } : {} },
                             (res) => { res.resume(); res.on('end', () => { lat.push(now() - t); if (res.statusCode === 200) ok++; done++; resolve(); }); });
    req.setTimeout(30000, () => req.destroy(new Error('timeout')));
    req.on('error', () => { done++; resolve(); });
    req.end(body || undefined);
  });
  const worker = async () => { while (now() < end && started < maxCount) { started++; await one(); } };
  await Promise.all(Array.from({ length: conc }, worker));
  const wall = (now() - t0) / 1000;
  agent.destroy();
  return { requests: done, ok, rps: ok / wall, seconds: wall, p50_ms: pct(lat, 0.5), p99_ms: pct(lat, 0.99) };
}

async function partFour() {
  const h = await rps('GET', '/health', null, opt.duration, opt.concurrency, opt.maxRequests);
  const c = await rps('POST', '/v1/chat/completions', chatBody(1, false), opt.duration, opt.concurrency, Math.min(opt.maxRequests, 50000));
  results.rps = { health: h, one_token: c };
  log(`\n4. requests/s, keep-alive, ${opt.concurrency} in flight, ${opt.duration} s each (at most ${opt.maxRequests} requests)`);
  log(`   GET /health: ${f(h.rps, 0)}/s (${h.ok}/${h.requests} ok, p50 ${f(h.p50_ms, 2)} ms, p99 ${f(h.p99_ms, 2)} ms)`);
  log(`   POST /v1/chat/completions max_tokens 1: ${f(c.rps, 0)}/s (${c.ok}/${c.requests} ok, p50 ${f(c.p50_ms, 2)} ms, p99 ${f(c.p99_ms, 2)} ms)`);
}

// --- optional: bench_streams (D-Bus Submit + JobUpdate signals, not the ring) at 1 and N streams ---------------------
function partDbus() {
  if (!opt.benchStreams) return Promise.resolve();
  return new Promise((resolve) => {
    execFile(opt.benchStreams, ['--address', opt.bus, '--route', opt.route, '--streams', `1,${opt.streams}`,
                                '--tokens', String(opt.tokens), '--long', '0'], { timeout: 300000 }, (err, out) => {
      const rows = {};
      for (const line of String(out || '').split('\n')) {
        const m = line.trim().match(/^(\d+)\s+([\d.]+)\s+[\d.]+\s+([\d.]+)\s+[\d.]+\s+([\d.]+)/);
        if (m) rows[m[1]] = { agg_tps: Number(m[2]), p50_gap_ms: Number(m[3]), p95_gap_ms: Number(m[4]) };
      }
      results.dbus = err ? { error: String(err.message).slice(0, 200) } : rows;
      log(`\n(reference) bench_streams, D-Bus Submit + JobUpdate signals, raw prompt "Once upon a time", no template:`);
      if (err) log(`   failed: ${String(err.message).slice(0, 200)}`);
      for (const [s, x] of Object.entries(rows))
        log(`   ${s} stream(s): ${f(x.agg_tps)} tok/s (first submit → last token), gap p50 ${f(x.p50_gap_ms, 2)} / p95 ${f(x.p95_gap_ms, 2)} ms`);
      resolve();
    });
  });
}

function table() {
  const o = results.one, G = results.many.gw, R = results.many.ring, h = results.rps;
  const rows = [];
  // ratio = gateway's performance relative to the ring: throughput gw/ring, times ring/gw (≥ 0.95: within 5 %).
  const row = (m, gw, ring, unit, higherBetter, d = 1) => {
    const ratio = Number.isFinite(ring) ? (higherBetter ? gw / ring : ring / gw) : NaN;
    rows.push([m, f(gw, d), Number.isFinite(ring) ? f(ring, d) : '-', unit, Number.isFinite(ratio) ? f(ratio, 3) : '-']);
  };
  row('1 stream: TTFT (ring: gw accept + ring accepted→1st)', o.gw_ttft_ms, o.ring_ttft_est_ms, 'ms', false, 2);
  row('1 stream: accepted → first token', o.gw_after_accept_ms, o.ring_after_accept_ms, 'ms', false, 2);
  row('1 stream back to back: TTFT (ring as above)', o.gw_b2b_ttft_ms, o.ring_ttft_est_ms, 'ms', false, 2);
  row('1 stream: decode (first → last chunk)', o.gw_decode_tps, o.ring_decode_tps, 'tok/s', true);
  row('1 stream: accepted → last token', o.gw_accept_to_last_ms, o.ring_accept_to_last_ms, 'ms', false);
  row(`${opt.streams} streams: aggregate (from 1st accept)`, G.agg_tps_from_accept, R.agg_tps_from_accept, 'tok/s', true);
  row(`${opt.streams} streams: p95 inter-token gap`, G.p95_gap_ms, R.p95_gap_ms, 'ms', false, 2);
  row(`${opt.streams} streams: p50 inter-token gap`, G.p50_gap_ms, R.p50_gap_ms, 'ms', false, 2);
  const D = results.dbus || {};
  if (D[String(opt.streams)]) {
    row(`  vs bench_streams ${opt.streams} (D-Bus): aggregate from start`, G.agg_tps, D[String(opt.streams)].agg_tps, 'tok/s', true);
    row(`  vs bench_streams ${opt.streams} (D-Bus): p95 gap`, G.p95_gap_ms, D[String(opt.streams)].p95_gap_ms, 'ms', false, 2);
  }
  row(`${opt.streams} streams: tandemd CPU per 1k tokens`, G.daemon_cpu_ms / (G.tokens / 1000), R.daemon_cpu_ms / (R.tokens / 1000), 'ms', false);
  row(`${opt.streams} streams: client-side CPU per 1k (http | tandemctl)`, G.http.cpu_ms_per_1k, R.tandemctl_cpu_ms / (R.tokens / 1000), 'ms', false);
  row('tandem-http VmRSS before / after the run', G.http.rss_before_kib / 1024, NaN, 'MiB', true);
  rows[rows.length - 1][1] = `${f(G.http.rss_before_kib / 1024)} / ${f(G.http.rss_after_kib / 1024)}`;
  row('tandem-http VmHWM (peak RSS)', G.http.hwm_kib / 1024, NaN, 'MiB', true);
  row(`GET /health, ${opt.concurrency} in flight`, h.health.rps, NaN, 'req/s', true, 0);
  row(`1-token chat completion, ${opt.concurrency} in flight`, h.one_token.rps, NaN, 'req/s', true, 0);
  const w = [0, 1, 2, 3, 4].map((i) => Math.max(...rows.map((r) => String(r[i]).length), ['metric', 'gateway', 'ring', 'unit', 'ratio'][i].length));
  const line = (r) => '| ' + r.map((c, i) => (i === 0 || i === 3 ? String(c).padEnd(w[i]) : String(c).padStart(w[i]))).join(' | ') + ' |';
  log('\nratio = the gateway relative to the ring path: throughput gateway/ring, times ring/gateway (≥ 0.95 = within 5 %)');
  log(line(['metric', 'gateway', 'ring', 'unit', 'ratio']));
  log('|' + w.map((x) => '-'.repeat(x + 2)).join('|') + '|');
  for (const r of rows) log(line(r));
}

try {
  await partOne();
  await partTwo();
  log(`\n3. tandem-http over the ${opt.streams}-stream rounds: CPU ${f(results.many.gw.http.cpu_ms, 0)} ms (utime+stime) for ` +
      `${results.many.gw.http.tokens} tokens = ${f(results.many.gw.http.cpu_ms_per_1k, 2)} ms per 1,000 streamed tokens; ` +
      `VmRSS ${f(results.many.gw.http.rss_before_kib / 1024)} → ${f(results.many.gw.http.rss_after_kib / 1024)} MiB, ` +
      `VmHWM ${f(results.many.gw.http.hwm_kib / 1024)} MiB`);
  log(`   (the best rounds: tandemd ${f(results.many.gw.daemon_cpu_ms, 0)} ms CPU behind the gateway vs ` +
      `${f(results.many.ring.daemon_cpu_ms, 0)} ms behind ${opt.streams} tandemctl; the ${opt.streams} tandemctl processes ` +
      `${f(results.many.ring.tandemctl_cpu_ms, 0)} ms; this driver ${f(results.many.gw.node_cpu_ms, 0)} ms (gateway) / ` +
      `${f(results.many.ring.node_cpu_ms, 0)} ms (ring))`);
  await partDbus();
  await partFour();
  table();
  if (opt.jsonOut) writeFileSync(opt.jsonOut, JSON.stringify(results, null, 1));
} catch (e) {
  console.error(`FAIL: ${e.stack || e}`);
  process.exit(1);
}
