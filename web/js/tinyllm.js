// tinyllm in the browser: GGUF models on WebGPU (or the CPU, in WebAssembly) behind an
// OpenAI-shaped API. The engine runs in a Web Worker; this module is the main thread's handle.
//
//   import { TinyLLM } from 'tinyllm';
//   const llm = await TinyLLM.load('https://example.com/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf',
//                                  { backend: 'auto', onProgress: (p) => console.log(p) });
//   const stream = await llm.chat.completions.create({ messages: [{ role: 'user', content: 'Hi' }], stream: true });
//   for await (const chunk of stream) console.log(chunk.choices[0]?.delta?.content ?? '');

import { TinyLLMError } from './errors.js';

export { TinyLLMError };

/** A stream of chunks as OpenAI's client returns it: async-iterable, with an abort controller. */
class ChunkStream {
  constructor(controller) {
    this.controller = controller;
    this._items = [];
    this._waiting = null;
    this._done = false;
    this._error = null;
  }

  _push(item) {
    this._items.push(item);
    this._wake();
  }

  _end(error) {
    this._done = true;
    this._error = error || null;
    this._wake();
  }

  _wake() {
    if (this._waiting) {
      const w = this._waiting;
      this._waiting = null;
      w();
    }
  }

  async *[Symbol.asyncIterator]() {
    for (;;) {
      if (this._items.length) {
        yield this._items.shift();
        continue;
      }
      if (this._done) {
        if (this._error) throw this._error;
        return;
      }
      await new Promise((r) => (this._waiting = r));
    }
  }
}

export class TinyLLM {
  /**
   * Load a GGUF model. `source`: a URL, an array of URLs (a split set, in order), a File or
   * Blob, or an ArrayBuffer. Options: `backend` ('auto' | 'webgpu' | 'cpu'), `onProgress`
   * ({phase, loaded, total, mbps}), `contextSize`, `threads` (CPU workers; needs a
   * cross-origin isolated page for more than one), `cache` (false: do not keep the file in
   * Cache Storage), `signal`, `name`, `workerUrl`.
   */
  static async load(source, options = {}) {
    const llm = new TinyLLM(options);
    try {
      await llm.load(source, options);
    } catch (e) {
      llm._terminate();
      throw e;
    }
    return llm;
  }

  /**
   * What a model will need, from its GGUF header alone (a Range request for the first bytes;
   * no tensor is downloaded): the bytes of its weights, KV cache (for `contextLength`
   * positions; default the trained context), working set and tokenizer, and the peak wasm
   * memory on each backend (`cpu.wasm_bytes`, `webgpu.wasm_bytes`, `webgpu.gpu_bytes`), with the
   * limits a load is held to (`limits.wasm_bytes`, `limits.device_bytes`). A load that would
   * exceed them fails with INSUFFICIENT_MEMORY as soon as the header is in.
   */
  static async estimate(source, options = {}) {
    const llm = new TinyLLM(options);
    const base = (typeof document !== 'undefined' && document.baseURI) || (globalThis.location && globalThis.location.href);
    const src = typeof source === 'string' || source instanceof URL ? new URL(String(source), base).href : source;
    try {
      return await llm._call({ op: 'estimate', source: src, contextLength: options.contextLength || 0 }, { signal: options.signal });
    } finally {
      llm._terminate();
    }
  }

  /**
   * An engine worker with no model yet (`workerUrl`: where the package's worker.js is served,
   * if not beside this module). Load one with `load()`; a failed load leaves the worker ready
   * for the next.
   */
  constructor(options = {}) {
    const workerUrl = options.workerUrl || new URL('./worker.js', import.meta.url);
    const worker = new Worker(workerUrl, { type: 'module', name: 'tinyllm' });
    this._worker = worker;
    this._next = 1;
    this._pending = new Map();
    this.info = null;
    worker.onmessage = (ev) => this._receive(ev.data);
    worker.onerror = (ev) => {
      const err = new TinyLLMError('WORKER_CRASHED', `the engine's worker failed: ${ev.message || 'unknown error'}`);
      for (const p of this._pending.values()) p.reject(err);
      this._pending.clear();
    };
    this.chat = { completions: { create: (request) => this._openai('chat', request) } };
    this.completions = { create: (request) => this._openai('completion', request) };
    this.embeddings = {
      create: (request) => {
        if (!request || typeof request !== 'object') throw new TinyLLMError('BAD_REQUEST', 'the request must be an object');
        const { signal, ...body } = request;
        return this._call({ op: 'embeddings', request: body }, { signal });
      },
    };
  }

  /** Load a model into this worker (replacing the one it holds); options as for `TinyLLM.load`. */
  async load(source, options = {}) {
    // URLs are relative to the page, not to the worker that fetches them.
    const base = (typeof document !== 'undefined' && document.baseURI) || (globalThis.location && globalThis.location.href);
    const resolve = (s) => (typeof s === 'string' || s instanceof URL ? new URL(String(s), base).href : s);
    const src = Array.isArray(source) ? source.map(resolve) : resolve(source);
    const first = Array.isArray(src) ? src[0] : src;
    const name = options.name || (typeof first === 'string' ? first.split('/').pop().split('?')[0] : 'model');
    this.info = null;
    this.info = await this._call(
      {
        op: 'load',
        source: src,
        backend: options.backend || 'auto',
        contextSize: options.contextSize || 0,
        threads: options.threads,
        cpuKernels: options.cpuKernels,
        webgpu: options.webgpu,
        cache: options.cache,
        name,
      },
      { signal: options.signal, onProgress: options.onProgress },
    );
    return this.info;
  }

  _terminate() {
    if (this._worker) this._worker.terminate();
    this._worker = null;
  }

  _receive(m) {
    const p = this._pending.get(m.id);
    if (!p) return;
    switch (m.type) {
      case 'progress':
        if (p.onProgress) p.onProgress(m.data);
        break;
      case 'chunk':
        if (p.onChunk) p.onChunk(JSON.parse(m.data));
        break;
      case 'done':
        this._pending.delete(m.id);
        p.resolve(m.data);
        break;
      case 'error':
        this._pending.delete(m.id);
        p.reject(new TinyLLMError(m.error.code, m.error.message, m.error.param));
        break;
    }
  }

  _call(msg, { signal, onProgress, onChunk } = {}) {
    if (!this._worker) return Promise.reject(new TinyLLMError('UNLOADED', 'the model was unloaded'));
    const id = this._next++;
    return new Promise((resolve, reject) => {
      if (signal && signal.aborted) {
        reject(new TinyLLMError('ABORTED', 'the request was aborted'));
        return;
      }
      const onAbort = () => this._worker && this._worker.postMessage({ op: 'abort', target: id });
      if (signal) signal.addEventListener('abort', onAbort, { once: true });
      const done = () => signal && signal.removeEventListener('abort', onAbort);
      this._pending.set(id, {
        onProgress,
        onChunk,
        resolve: (v) => {
          done();
          resolve(v);
        },
        reject: (e) => {
          done();
          reject(e);
        },
      });
      this._worker.postMessage({ ...msg, id });
    });
  }

  /** OpenAI's create(): a completion object, or (with `stream: true`) an async iterable of chunks. */
  async _openai(op, request) {
    if (!request || typeof request !== 'object') throw new TinyLLMError('BAD_REQUEST', 'the request must be an object');
    const { signal, ...body } = request;
    if (!body.stream) return this._call({ op, request: body }, { signal });
    const controller = new AbortController();
    if (signal) {
      if (signal.aborted) controller.abort();
      else signal.addEventListener('abort', () => controller.abort(), { once: true });
    }
    const stream = new ChunkStream(controller);
    this._call({ op, request: body }, { signal: controller.signal, onChunk: (c) => stream._push(c) }).then(
      () => stream._end(),
      (e) => stream._end(e),
    );
    return stream;
  }

  /**
   * The low-level twin of `tinyllm-native run --json`: `{promptIds, maxTokens, temperature,
   * seed, topK, topP, topLogprobs, signal}` resolves to `{tokens, topLogprobs, text, stop,
   * timings}`, `topLogprobs[step]` a list of `[id, logprob]` pairs, best first.
   */
  async generate(options) {
    const { signal, ...o } = options || {};
    const r = await this._call({ op: 'generate', options: o }, { signal });
    return { tokens: r.tokens, topLogprobs: r.top_logprobs, text: r.text, stop: r.stop, timings: r.timings };
  }

  /** Token ids of `text` (the model's BOS added where it wants one, unless `addSpecial` is false). */
  tokenize(text, { addSpecial = true, parseSpecial = true } = {}) {
    return this._call({ op: 'tokenize', text: String(text), addSpecial, parseSpecial });
  }

  /** The text of token ids. */
  detokenize(ids) {
    return this._call({ op: 'detokenize', ids: Array.from(ids) });
  }

  /**
   * The engine's memory: `{wasm_bytes}`, the size of the wasm module's linear memory, which
   * only grows (so it is also the peak). Model weights on WebGPU live in GPU buffers instead.
   */
  memoryUsage() {
    return this._call({ op: 'memory' });
  }

  /**
   * The CPU backend's profile recorded since it was last turned on (by call site: each op's
   * time and the time the pass spent alone before it), then recording turned on (and cleared)
   * or off. A diagnostic: where a decode step's time goes, and what only one thread does.
   */
  profile(enable) {
    return this._call({ op: 'profile', enable: !!enable });
  }

  /** Free the model and stop the worker. */
  async unload() {
    if (!this._worker) return;
    try {
      await this._call({ op: 'unload' });
    } finally {
      this._terminate();
    }
  }

  /** Forget the models kept in Cache Storage (all, or the one at `url`). */
  static async clearCache(url) {
    const { clearCache } = await import('./source.js');
    return clearCache(url);
  }
}
