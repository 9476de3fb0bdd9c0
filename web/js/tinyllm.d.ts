// Types of the `tinyllm` package. The request and response objects follow OpenAI's
// chat.completions and completions APIs; only the fields tinyllm reads or writes are listed.

export type ErrorCode =
  | 'NOT_FOUND' | 'HTTP_ERROR' | 'CORS' | 'NETWORK'
  | 'NOT_GGUF' | 'TRUNCATED' | 'BAD_GGUF'
  | 'UNSUPPORTED_ARCH' | 'BAD_MODEL'
  | 'NO_WEBGPU' | 'GPU_OUT_OF_MEMORY' | 'INSUFFICIENT_MEMORY'
  | 'BAD_REQUEST' | 'CONTEXT_LENGTH_EXCEEDED'
  | 'ABORTED' | 'BUSY' | 'UNLOADED' | 'WORKER_CRASHED' | 'INTERNAL';

export class TinyLLMError extends Error {
  readonly code: ErrorCode;
  /** The request field at fault, for BAD_REQUEST. */
  readonly param?: string;
}

export type ModelSource = string | URL | Blob | ArrayBuffer | ArrayBufferView | Array<string | URL | Blob>;

export interface LoadProgress {
  /** `download`: bytes arriving from the network; `load`: bytes placed in the engine. */
  phase: 'download' | 'load';
  loaded: number;
  /** Bytes of the files opened so far. */
  total: number;
  /** Average megabytes per second since the load started. */
  mbps: number;
}

export interface LoadOptions {
  /**
   * `auto` (default): WebGPU on a hardware adapter, else the wasm CPU (a fallback, software
   * adapter such as SwiftShader is never picked: it runs on the same CPU, many times slower).
   * `webgpu` uses any adapter. `info.backend_reason` says what was chosen and why.
   */
  backend?: 'auto' | 'webgpu' | 'cpu';
  /**
   * The wasm CPU kernels: `auto` (default) relaxed SIMD where the browser runs it, else SIMD128;
   * `relaxed` insists (BAD_REQUEST where the browser lacks it); `simd128` never uses relaxed
   * SIMD. The first load of a TinyLLM instance picks the build.
   */
  cpuKernels?: 'auto' | 'relaxed' | 'simd128';
  /** WebGPU device options. `f16: false` asks for a device without shader-f16 (f32 kernels). */
  webgpu?: { f16?: boolean };
  onProgress?: (p: LoadProgress) => void;
  /** Positions in the context (default: the model's trained context). */
  contextSize?: number;
  /** CPU workers (more than one needs a cross-origin isolated page). */
  threads?: number;
  /** Keep downloaded files in Cache Storage (default true). */
  cache?: boolean;
  signal?: AbortSignal;
  /** The model name responses report. */
  name?: string;
  /** Where the package's worker.js is served, if not beside this module. */
  workerUrl?: string | URL;
}

export interface ModelInfo {
  name: string;
  architecture: string;
  backend: 'webgpu' | 'cpu';
  device: string;
  context_size: number;
  n_vocab: number;
  n_layer: number;
  n_embd: number;
  threads: number;
  /** Why this backend: `auto`'s choice and the adapter it saw, or what was asked for. */
  backend_reason: string;
  /** The wasm build that runs: `wasm`, `wasm-relaxed`, `wasm-mt`, `wasm-mt-relaxed`. */
  wasm_build: string;
  /** The WebGPU device has shader-f16 (false on the CPU backend). */
  f16: boolean;
  /** Every file came from Cache Storage. */
  cached: boolean;
  load_s: number;
}

/** Bytes a model needs, from `TinyLLM.estimate`. */
export interface MemoryEstimate {
  /** Positions the KV cache is sized for. */
  n_ctx: number;
  weights: number;
  kv: number;
  /** Recurrent state (qwen35), whatever the context. */
  recurrent: number;
  /** Activations of a 512-token prefill batch and the logits. */
  working: number;
  tokenizer: number;
  /** The header's parsed metadata, which the model keeps (mostly the vocabulary's arrays). */
  metadata: number;
  largest_tensor: number;
  file_bytes: number;
  /** Peak wasm memory on the CPU backend. */
  cpu: { wasm_bytes: number };
  /** Peak wasm memory and GPU memory on WebGPU. */
  webgpu: { wasm_bytes: number; gpu_bytes: number };
  /** What a load is held to: wasm32's 4 GiB, and the device's memory where the browser says it. */
  limits: { wasm_bytes: number; device_bytes: number | null };
}

export interface ChatMessage {
  role: 'system' | 'user' | 'assistant' | 'tool';
  content: string | null | Array<{ type: 'text'; text: string }>;
  name?: string;
  tool_calls?: ToolCall[];
  tool_call_id?: string;
  reasoning_content?: string;
}

export interface ToolCall {
  id: string;
  type: 'function';
  function: { name: string; arguments: string };
}

export interface Tool {
  type: 'function';
  function: { name: string; description?: string; parameters?: object };
}

interface SamplingParams {
  max_tokens?: number;
  max_completion_tokens?: number;
  temperature?: number;
  top_p?: number;
  top_k?: number;
  min_p?: number;
  seed?: number;
  stop?: string | string[];
  presence_penalty?: number;
  frequency_penalty?: number;
  repeat_penalty?: number;
  logprobs?: boolean;
  top_logprobs?: number;
  stream?: boolean;
  stream_options?: { include_usage?: boolean };
  signal?: AbortSignal;
}

export interface ChatCompletionRequest extends SamplingParams {
  messages: ChatMessage[];
  tools?: Tool[];
  tool_choice?: 'auto' | 'none' | 'required' | { type: 'function'; function: { name: string } };
  parallel_tool_calls?: boolean;
  chat_template_kwargs?: Record<string, unknown>;
}

export interface CompletionRequest extends SamplingParams {
  prompt: string | number[];
}

export interface Usage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
  prompt_tokens_details?: { cached_tokens: number };
}

export interface ChatCompletion {
  id: string;
  object: 'chat.completion';
  created: number;
  model: string;
  choices: Array<{
    index: number;
    message: { role: 'assistant'; content: string | null; reasoning_content?: string; tool_calls?: ToolCall[] };
    finish_reason: 'stop' | 'length' | 'tool_calls';
    logprobs: unknown;
  }>;
  usage: Usage;
}

export interface ChatCompletionChunk {
  id: string;
  object: 'chat.completion.chunk';
  created: number;
  model: string;
  choices: Array<{
    index: number;
    delta: {
      role?: 'assistant';
      content?: string;
      reasoning_content?: string;
      tool_calls?: Array<{ index: number; id?: string; type?: 'function'; function?: { name?: string; arguments?: string } }>;
    };
    finish_reason: 'stop' | 'length' | 'tool_calls' | null;
    logprobs: unknown;
  }>;
  usage?: Usage;
}

export interface Completion {
  id: string;
  object: 'text_completion';
  created: number;
  model: string;
  choices: Array<{ index: number; text: string; finish_reason: 'stop' | 'length'; logprobs: unknown }>;
  usage: Usage;
}

export interface CompletionChunk {
  id: string;
  object: 'text_completion';
  created: number;
  model: string;
  choices: Array<{ index: number; text: string; finish_reason: 'stop' | 'length' | null; logprobs: unknown }>;
  usage?: Usage;
}

export interface Stream<T> extends AsyncIterable<T> {
  controller: AbortController;
}

export interface GenerateOptions {
  promptIds: number[];
  maxTokens?: number;
  temperature?: number;
  seed?: number;
  topK?: number;
  topP?: number;
  topLogprobs?: number;
  signal?: AbortSignal;
}

export interface GenerateResult {
  tokens: number[];
  /** Per generated token, `[id, logprob]` pairs, best first. */
  topLogprobs: Array<Array<[number, number]>>;
  text: string;
  stop: 'eos' | 'stop' | 'length' | 'context' | 'cancelled';
  timings: Record<string, number | string>;
}

export class TinyLLM {
  /** A worker with the model `source` loaded. */
  static load(source: ModelSource, options?: LoadOptions): Promise<TinyLLM>;
  /** What a model will need, from its GGUF header alone (no tensor is downloaded). */
  static estimate(source: ModelSource, options?: { contextLength?: number; signal?: AbortSignal; workerUrl?: string | URL }): Promise<MemoryEstimate>;
  /** A worker with no model yet. */
  constructor(options?: { workerUrl?: string | URL });
  /** Load (or replace) this worker's model; a failed load leaves the worker usable. */
  load(source: ModelSource, options?: LoadOptions): Promise<ModelInfo>;
  static clearCache(url?: string): Promise<boolean>;
  /** The loaded model (null before a load succeeds). */
  readonly info: ModelInfo | null;
  readonly chat: {
    completions: {
      create(request: ChatCompletionRequest & { stream: true }): Promise<Stream<ChatCompletionChunk>>;
      create(request: ChatCompletionRequest & { stream?: false }): Promise<ChatCompletion>;
      create(request: ChatCompletionRequest): Promise<ChatCompletion | Stream<ChatCompletionChunk>>;
    };
  };
  readonly completions: {
    create(request: CompletionRequest & { stream: true }): Promise<Stream<CompletionChunk>>;
    create(request: CompletionRequest & { stream?: false }): Promise<Completion>;
    create(request: CompletionRequest): Promise<Completion | Stream<CompletionChunk>>;
  };
  /**
   * OpenAI's embeddings: one unit-length vector per input (a text, texts or token arrays),
   * pooled by `pooling` (default: the model's own `pooling_type`, else `last`).
   */
  readonly embeddings: {
    create(request: EmbeddingRequest): Promise<EmbeddingResponse>;
  };
  generate(options: GenerateOptions): Promise<GenerateResult>;
  tokenize(text: string, options?: { addSpecial?: boolean; parseSpecial?: boolean }): Promise<number[]>;
  detokenize(ids: number[] | Uint32Array): Promise<string>;
  /** The wasm module's linear memory in bytes (it only grows: also the peak). */
  memoryUsage(): Promise<{ wasm_bytes: number }>;
  /**
   * The CPU backend's op profile recorded so far (by call site: the op's time, and the time
   * the pass spent alone before it), then recording turned on (cleared) or off. A diagnostic.
   */
  profile(enable: boolean): Promise<{
    passes: number;
    pass_ms: number;
    tail_ms: number;
    sites: { site: string; calls: number; op_ms: number; alone_ms: number }[];
  } | null>;
  unload(): Promise<void>;
}

export interface EmbeddingRequest {
  input: string | string[] | number[] | number[][];
  model?: string;
  /** `float` (default) or `base64` (little-endian f32). */
  encoding_format?: 'float' | 'base64';
  /** Only the model's own width is accepted. */
  dimensions?: number;
  /** How token vectors become one (a tinyllm extension). */
  pooling?: 'mean' | 'cls' | 'last';
  signal?: AbortSignal;
}

export interface EmbeddingResponse {
  object: 'list';
  data: { object: 'embedding'; index: number; embedding: number[] | string }[];
  model: string;
  usage: { prompt_tokens: number; total_tokens: number };
}
