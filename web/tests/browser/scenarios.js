// The browser tests' scenarios: each takes the Rust test's arguments and returns what it saw
// as JSON; the Rust side (../browser.rs) compares it with the native engine.
import { TinyLLM } from '/pkg/tinyllm.js';

/** An error as data. */
function caught(e) {
  return { code: e.code || null, name: e.name, message: String(e.message || e) };
}

async function expectError(f) {
  try {
    await f();
    return { code: null, message: 'no error' };
  } catch (e) {
    return caught(e);
  }
}

/**
 * The page's memory, workers included, where the browser can measure it
 * (`performance.measureUserAgentSpecificMemory`, cross-origin isolated pages): total bytes and
 * the JavaScript heap of the main thread.
 */
async function pageMemory() {
  const out = { jsHeapBytes: performance.memory ? performance.memory.usedJSHeapSize : null, totalBytes: null };
  if (self.crossOriginIsolated && performance.measureUserAgentSpecificMemory) {
    const m = await performance.measureUserAgentSpecificMemory();
    out.totalBytes = m.bytes;
    out.breakdown = m.breakdown.filter((b) => b.bytes > 0).map((b) => ({ bytes: b.bytes, types: b.types, scope: b.attribution.map((a) => a.scope).join(',') }));
  }
  return out;
}

window.scenarios = {
  /**
   * Greedy runs of `models` ({url, promptIds, maxTokens}) on `backend`, each in a fresh worker;
   * `options` go to `load` as they are (cpuKernels, webgpu).
   */
  async greedy({ models, backend, contextSize, threads, options }) {
    const out = [];
    for (const m of models) {
      const llm = await TinyLLM.load(m.url, { backend, contextSize: contextSize || 512, threads, cache: false, ...(options || {}) });
      const r = await llm.generate({ promptIds: m.promptIds, maxTokens: m.maxTokens, temperature: 0, topLogprobs: 2 });
      out.push({ url: m.url, info: llm.info, tokens: r.tokens, topLogprobs: r.topLogprobs, timings: r.timings });
      await llm.unload();
    }
    return out;
  },

  /**
   * `llm.embeddings.create` on each of `cases` ({url, texts, pooling}) on `backend`: the
   * float answer, and the base64 one decoded (it must hold the same vectors).
   */
  async embeddings({ cases, backend, webgpu }) {
    const out = [];
    for (const c of cases) {
      const llm = await TinyLLM.load(c.url, { backend, contextSize: 512, cache: false, threads: 1, webgpu });
      const floats = await llm.embeddings.create({ input: c.texts, pooling: c.pooling });
      const b64 = await llm.embeddings.create({ input: c.texts, pooling: c.pooling, encoding_format: 'base64' });
      const decoded = b64.data.map((d) => {
        const bytes = Uint8Array.from(atob(d.embedding), (ch) => ch.charCodeAt(0));
        return Array.from(new Float32Array(bytes.buffer));
      });
      const bad = await expectError(() => llm.embeddings.create({ input: '' }));
      out.push({ info: llm.info, floats, decoded, bad });
      await llm.unload();
    }
    return out;
  },

  /**
   * What `backend: 'auto'` picks on this page, next to the adapter the page itself sees
   * (null where there is none).
   */
  async autoChoice({ url }) {
    let adapter = null;
    if (navigator.gpu) {
      const a = await navigator.gpu.requestAdapter();
      if (a) {
        const i = a.info || {};
        adapter = { vendor: i.vendor, architecture: i.architecture, isFallbackAdapter: i.isFallbackAdapter ?? a.isFallbackAdapter ?? null, f16: a.features.has('shader-f16') };
      }
    }
    const llm = await TinyLLM.load(url, { backend: 'auto', contextSize: 128, cache: false });
    const r = await llm.generate({ promptIds: [1, 2, 3], maxTokens: 2, temperature: 0 });
    const info = llm.info;
    await llm.unload();
    return { adapter, info, tokens: r.tokens };
  },

  /**
   * `TinyLLM.estimate` of `url` for `contextSize` positions, then a load on `backend` with that
   * context in a fresh worker, a prefill of `promptTokens` tokens (ids `firstId` upwards) and a
   * few decoded ones, and the wasm memory's peak.
   */
  async memory({ url, backend, contextSize, promptTokens, firstId }) {
    const estimate = await TinyLLM.estimate(url, { contextLength: contextSize });
    const llm = await TinyLLM.load(url, { backend, contextSize, cache: false, threads: 1 });
    const promptIds = Array.from({ length: promptTokens }, (_, i) => firstId + (i % 1000));
    await llm.generate({ promptIds, maxTokens: 4, temperature: 0 });
    const mem = await llm.memoryUsage();
    const info = llm.info;
    await llm.unload();
    return { estimate, measured: mem.wasm_bytes, info };
  },

  /** A load of `url` with `contextSize` (0: the trained context) on `backend`: its error, or 'loaded'. */
  async loadOrError({ url, backend, contextSize }) {
    const got = await expectError(async () => {
      const llm = await TinyLLM.load(url, { backend, contextSize, cache: false });
      await llm.generate({ promptIds: [1, 2, 3], maxTokens: 2, temperature: 0 });
      await llm.unload();
    });
    return got.code === null ? { code: 'loaded' } : got;
  },

  /** Load `url` twice (Cache Storage on), reporting where each load came from. */
  async cache({ url, backend }) {
    await TinyLLM.clearCache();
    const loads = [];
    for (let i = 0; i < 2; i++) {
      const phases = new Set();
      const llm = await TinyLLM.load(url, { backend, contextSize: 128, onProgress: (p) => phases.add(p.phase) });
      const r = await llm.generate({ promptIds: [1, 2, 3], maxTokens: 2, temperature: 0 });
      loads.push({ cached: llm.info.cached, phases: [...phases], tokens: r.tokens });
      await llm.unload();
    }
    return loads;
  },

  /** A split set ({urls}) and a flaky download ({flakyUrl}) load and answer like the whole file ({url}). */
  async sources({ url, urls, flakyUrl, backend, promptIds }) {
    const run = async (src, opts = {}) => {
      const llm = await TinyLLM.load(src, { backend, contextSize: 128, ...opts });
      const r = await llm.generate({ promptIds, maxTokens: 6, temperature: 0 });
      await llm.unload();
      return r.tokens;
    };
    const bytes = await (await fetch(url)).arrayBuffer();
    return {
      whole: await run(url, { cache: false }),
      split: await run(urls, { cache: false }),
      flaky: await run(flakyUrl, { cache: false }),
      blob: await run(new Blob([bytes]), {}),
      buffer: await run(bytes, {}),
    };
  },

  /** Bad input, one after another in the same worker, which then still answers. */
  async errors({ notFound, truncated, notGguf, unsupported, crossOrigin, good, backend }) {
    const llm = new TinyLLM();
    const opts = { backend, contextSize: 128, cache: false };
    const out = {};
    out.notFound = await expectError(() => llm.load(notFound, opts));
    out.truncated = await expectError(() => llm.load(truncated, opts));
    out.notGguf = await expectError(() => llm.load(notGguf, opts));
    out.unsupported = await expectError(() => llm.load(unsupported, opts));
    out.crossOrigin = await expectError(() => llm.load(crossOrigin, opts));
    out.badBackend = await expectError(() => llm.load(good, { ...opts, backend: 'tpu' }));
    await llm.load(good, opts);
    out.loadedAfter = llm.info.architecture;
    out.badRequest = await expectError(() => llm.chat.completions.create({ messages: 'hello' }));
    out.emptyMessages = await expectError(() => llm.chat.completions.create({ messages: [] }));
    out.badTemperature = await expectError(() => llm.generate({ promptIds: [1, 2], temperature: -1 }));
    out.badIds = await expectError(() => llm.generate({ promptIds: [1, 1e9] }));
    out.tooLong = await expectError(() => llm.generate({ promptIds: Array(200).fill(5), maxTokens: 4 }));
    // An aborted generation: stops between tokens, the worker answers the next request.
    const ctl = new AbortController();
    const stream = await llm.chat.completions.create({
      messages: [{ role: 'user', content: 'Count to one hundred.' }],
      stream: true,
      max_tokens: 100,
      temperature: 0,
      signal: ctl.signal,
    });
    let chunks = 0;
    out.aborted = await expectError(async () => {
      for await (const c of stream) {
        if (c.choices[0] && c.choices[0].delta && c.choices[0].delta.content) chunks++;
        if (chunks === 3) ctl.abort();
      }
    });
    out.chunksBeforeAbort = chunks;
    const after = await llm.generate({ promptIds: [1, 15, 27], maxTokens: 3, temperature: 0 });
    out.tokensAfter = after.tokens;
    const whole = await llm.chat.completions.create({ messages: [{ role: 'user', content: 'Hi' }], max_tokens: 4, temperature: 0 });
    out.wholeAfter = { object: whole.object, finish: whole.choices[0].finish_reason, usage: whole.usage };
    // Constrained decoding runs in the worker too (llguidance built for wasm32): the fixture's
    // random weights write noise unless held to the schema, a grammar or a forced call.
    const schema = {
      type: 'object',
      properties: { color: { enum: ['red', 'green'] }, n: { type: 'integer', minimum: 1, maximum: 9 } },
      required: ['color', 'n'],
      additionalProperties: false,
    };
    out.jsonAnswers = [];
    for (const stream of [false, true]) {
      const req = {
        messages: [{ role: 'user', content: 'A color and a digit.' }],
        max_tokens: 40,
        temperature: 1,
        seed: 7,
        stream,
        response_format: { type: 'json_schema', json_schema: { name: 'pick', schema, strict: true } },
      };
      let text = '';
      if (stream) {
        for await (const c of await llm.chat.completions.create(req)) text += (c.choices[0] && c.choices[0].delta.content) || '';
      } else {
        text = (await llm.chat.completions.create(req)).choices[0].message.content;
      }
      out.jsonAnswers.push(text);
    }
    out.badGrammar = await expectError(() =>
      llm.chat.completions.create({ messages: [{ role: 'user', content: 'x' }], grammar: 'start: (' }));
    const forced = await llm.chat.completions.create({
      messages: [{ role: 'user', content: 'Weather?' }],
      tools: [{ type: 'function', function: { name: 'get_weather', parameters: schema } }],
      tool_choice: 'required',
      max_tokens: 60,
      temperature: 1,
      seed: 3,
    });
    out.forcedCall = forced.choices[0].message.tool_calls || null;
    await llm.unload();
    out.unloaded = await expectError(() => llm.generate({ promptIds: [1] }));
    return out;
  },

  /**
   * Speed of the package on `url`: `rounds` greedy runs of `promptText` (a different first
   * word each round, so no prefix is reused) for `decodeTokens` tokens, with the engine's own
   * prefill and decode timings; then the wasm memory (its peak) and the page's memory.
   */
  async benchTinyllm({ url, backend, threads, promptText, decodeTokens, rounds, cpuKernels }) {
    const llm = await TinyLLM.load(url, { backend, threads, contextSize: 1024, cache: false, cpuKernels });
    await llm.generate({ promptIds: await llm.tokenize('Warm up.'), maxTokens: 4, temperature: 0 });
    const runs = [];
    for (let i = 0; i < rounds; i++) {
      const ids = await llm.tokenize(`${i + 1}. ${promptText}`);
      const t0 = performance.now();
      const r = await llm.generate({ promptIds: ids, maxTokens: decodeTokens, temperature: 0 });
      runs.push({ ...r.timings, wall_s: (performance.now() - t0) / 1000 });
    }
    const mem = await llm.memoryUsage();
    const page = await pageMemory();
    const info = llm.info;
    await llm.unload();
    return { info, runs, wasmBytes: mem.wasm_bytes, page };
  },

  /**
   * Where a decode step's time goes on the CPU: the engine's op profile (by call site) over
   * `decodeTokens` greedy tokens after a short prompt, with the run's decode rate.
   */
  async profileTinyllm({ url, threads, cpuKernels, decodeTokens }) {
    const llm = await TinyLLM.load(url, { backend: 'cpu', threads, contextSize: 1024, cache: false, cpuKernels });
    await llm.generate({ promptIds: await llm.tokenize('Warm up.'), maxTokens: 4, temperature: 0 });
    const ids = await llm.tokenize('Once upon a time');
    await llm.profile(true);
    const r = await llm.generate({ promptIds: ids, maxTokens: decodeTokens, temperature: 0 });
    const profile = await llm.profile(false);
    const info = llm.info;
    await llm.unload();
    return { info, timings: r.timings, profile };
  },

  /** The threaded build's per-op hand-off, rayon's against the team's (µs per op). */
  async dispatchOverhead({ threads, ops, build }) {
    const w = new Worker('/dispatch-worker.js', { type: 'module' });
    const out = await new Promise((resolve) => {
      w.onmessage = (e) => resolve(e.data);
      w.postMessage({ threads, ops, build: build || 'wasm-mt-relaxed', serial: [0, 20000] });
    });
    w.terminate();
    return out;
  },

  /** The same measurement with @wllama/wllama (llama.cpp in wasm), served at /wllama/. */
  async benchWllama({ url, threads, gpu, promptText, decodeTokens, rounds }) {
    const { Wllama } = await import('/wllama/index.js');
    const w = new Wllama({ default: '/wllama/wasm/wllama.wasm' }, { logger: { debug() {}, log() {}, warn: console.warn, error: console.error } });
    await w.loadModelFromUrl(url, { n_threads: threads, n_ctx: 1024, n_gpu_layers: gpu ? 999 : 0, useCache: false });
    const warm = await w.createCompletion({ prompt: 'Warm up.', max_tokens: 4, temperature: 0 });
    const runs = [];
    for (let i = 0; i < rounds; i++) {
      const t0 = performance.now();
      const r = await w.createCompletion({
        prompt: `${i + 1}. ${promptText}`, max_tokens: decodeTokens, temperature: 0, cache_prompt: false,
      });
      const t = r.timings;
      runs.push({
        prompt_tokens: t.prompt_n, generated_tokens: t.predicted_n,
        prefill_tok_s: t.prompt_per_second, decode_tok_s: t.predicted_per_second, wall_s: (performance.now() - t0) / 1000,
      });
    }
    const page = await pageMemory();
    const out = { info: { threads: w.getNumThreads(), multithread: w.isMultithread(), warm: !!warm }, runs, page };
    await w.exit();
    return out;
  },
};
