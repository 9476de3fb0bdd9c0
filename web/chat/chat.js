// The tinyllm chat page: one page, two transports. Under `tinyllm-native serve` it talks to the
// server's OpenAI API over HTTP; in the browser build (the npm package's chat/ folder) it runs
// the model in this tab through the package's Web Worker. Both hand the page the same OpenAI
// chat chunks, so everything below `transport` is shared. Conversations live in IndexedDB.
//
// The transport: the page's `tinyllm-transport` meta tag (the server rewrites it to `http`),
// or the query parameter `transport=http|worker`. For the worker, `model=URL` loads a model
// at once and `backend=auto|webgpu|cpu` picks where it runs.

import { marked } from './vendor/marked.js';
import DOMPurify from './vendor/purify.js';
import * as idb from './vendor/idb-keyval.js';

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);

// ---- transports: { kind, ready, label(), stream(body, signal) -> async iterator of chunks }

function authHeaders() {
  const h = { 'Content-Type': 'application/json' };
  if ($('key').value) h.Authorization = 'Bearer ' + $('key').value;
  return h;
}

/** Reads an SSE body: yields the payload of each `data:` line until `[DONE]`. */
async function* sseData(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf('\n\n')) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      for (const line of event.split('\n')) {
        if (!line.startsWith('data: ')) continue;
        const data = line.slice(6);
        if (data === '[DONE]') return;
        yield JSON.parse(data);
      }
    }
  }
}

function httpTransport() {
  return {
    kind: 'http',
    ready: true,
    async label() {
      const m = await (await fetch('/v1/models', { headers: authHeaders() })).json();
      return m.data ? m.data[0].id : '';
    },
    async *stream(body, signal) {
      const res = await fetch('/v1/chat/completions', {
        method: 'POST',
        headers: authHeaders(),
        signal,
        body: JSON.stringify({ ...body, stream: true, stream_options: { include_usage: true } }),
      });
      if (!res.ok) {
        const err = await res.json().catch(() => ({}));
        throw new Error((err.error && err.error.message) || res.statusText);
      }
      for await (const chunk of sseData(res)) {
        if (chunk.error) throw new Error(chunk.error.message);
        yield chunk;
      }
    },
  };
}

async function workerTransport() {
  const { TinyLLM } = await import('../tinyllm.js');
  const llm = new TinyLLM();
  return {
    kind: 'worker',
    ready: false,
    llm,
    async label() {
      const i = llm.info;
      return i ? `${i.name} (${i.architecture}, ${i.backend === 'cpu' ? `wasm CPU, ${i.threads} thread${i.threads > 1 ? 's' : ''}` : 'WebGPU ' + i.device})` : '';
    },
    async load(source, backend, onProgress) {
      this.ready = false;
      await llm.load(source, { backend, onProgress });
      this.ready = true;
    },
    async *stream(body, signal) {
      const stream = await llm.chat.completions.create({ ...body, stream: true, stream_options: { include_usage: true }, signal });
      yield* stream;
    },
  };
}

function pickTransport() {
  const want = params.get('transport') || document.querySelector('meta[name="tinyllm-transport"]')?.content;
  return want === 'http' ? httpTransport() : workerTransport();
}

// ---- conversations (IndexedDB): { id, title, system, messages, updated }

const store = idb.createStore('tinyllm-chat', 'conversations');
let current = newConversation();

function newConversation() {
  return { id: `${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 8)}`, title: '', system: '', messages: [], updated: 0 };
}

async function save(conv) {
  if (conv.messages.length === 0) return;
  conv.updated = Date.now();
  conv.title = conv.title || conv.messages.find((m) => m.role === 'user')?.content.slice(0, 60) || 'chat';
  await idb.set(conv.id, conv, store);
  await listConversations();
}

async function listConversations() {
  const all = (await idb.values(store)).sort((a, b) => b.updated - a.updated);
  const ul = $('conversations');
  ul.textContent = '';
  for (const c of all) {
    const li = document.createElement('li');
    li.dataset.id = c.id;
    if (c.id === current.id) li.className = 'current';
    const span = document.createElement('span');
    span.textContent = c.title;
    span.title = c.title;
    const del = document.createElement('button');
    del.textContent = '×';
    del.title = 'delete';
    del.addEventListener('click', async (ev) => {
      ev.stopPropagation();
      await idb.del(c.id, store);
      if (c.id === current.id) startConversation(newConversation());
      await listConversations();
    });
    li.append(span, del);
    li.addEventListener('click', () => startConversation(c));
    ul.appendChild(li);
  }
}

function startConversation(conv) {
  if (controller) controller.abort();
  current = conv;
  $('system').value = conv.system || '';
  $('log').textContent = '';
  for (const m of conv.messages) {
    if (m.role === 'user') bubble('user', m.content);
    else if (m.role === 'assistant') renderAnswer(bubble('assistant'), m);
  }
  for (const li of $('conversations').children) li.className = li.dataset.id === conv.id ? 'current' : '';
}

// ---- rendering

function bubble(role, text) {
  const div = document.createElement('div');
  div.className = 'msg ' + role;
  if (text !== undefined) div.textContent = text;
  $('log').appendChild(div);
  div.scrollIntoView({ block: 'end' });
  return div;
}

/** An answer bubble's parts: reasoning (collapsible), markdown body, tool calls. */
function answerParts(out) {
  const reasoning = document.createElement('details');
  reasoning.className = 'reasoning';
  reasoning.innerHTML = '<summary>reasoning</summary>';
  const thought = document.createElement('div');
  reasoning.appendChild(thought);
  reasoning.hidden = true;
  const body = document.createElement('div');
  body.className = 'body';
  body.dataset.raw = '';
  const tools = document.createElement('div');
  tools.className = 'tool';
  out.append(reasoning, body, tools);
  return { reasoning, thought, body, tools };
}

/** Markdown to sanitized HTML: model output is untrusted. */
function markdown(el, text) {
  el.dataset.raw = text;
  el.innerHTML = DOMPurify.sanitize(marked.parse(text));
}

function renderAnswer(out, m) {
  const p = answerParts(out);
  if (m.reasoning_content) {
    p.reasoning.hidden = false;
    p.thought.textContent = m.reasoning_content;
  }
  markdown(p.body, m.content || '');
  p.tools.textContent = (m.tool_calls || []).map((c) => `[tool call] ${c.function.name}(${c.function.arguments})`).join('\n');
  return p;
}

// ---- sending

let transport = null;
let controller = null;

async function send(text) {
  // This conversation: "New chat" may replace `current` while an answer is still finishing,
  // and that answer must not land in the new one.
  const conv = current;
  conv.system = $('system').value.trim();
  conv.messages.push({ role: 'user', content: text });
  bubble('user', text);
  const out = bubble('assistant');
  const p = answerParts(out);
  let content = '';
  let reasoning = '';
  const calls = [];
  let usage = null;
  let first = 0;
  let last = 0;
  let stopped = false;
  controller = new AbortController();
  $('send').textContent = 'Stop';
  try {
    // Earlier answers go back as their visible text: the reasoning is not part of the turn.
    const turns = conv.messages.map((m) => ({ role: m.role, content: m.content }));
    const messages = (conv.system ? [{ role: 'system', content: conv.system }] : []).concat(turns);
    const body = { messages, temperature: Number($('temperature').value), max_tokens: Number($('max_tokens').value) };
    for await (const chunk of transport.stream(body, controller.signal)) {
      if (chunk.usage) usage = chunk.usage;
      const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
      if (!delta) continue;
      if (delta.content || delta.reasoning_content || delta.tool_calls) {
        last = performance.now();
        first = first || last;
      }
      if (delta.reasoning_content) {
        // Open while it streams; folded once the answer proper starts.
        if (!reasoning) {
          p.reasoning.hidden = false;
          p.reasoning.open = true;
        }
        reasoning += delta.reasoning_content;
        p.thought.textContent = reasoning;
      }
      if (delta.content) {
        if (!content && reasoning) p.reasoning.open = false;
        content += delta.content;
        markdown(p.body, content);
      }
      for (const c of delta.tool_calls || []) {
        const call = calls[c.index] || (calls[c.index] = { id: c.id, type: 'function', function: { name: '', arguments: '' } });
        if (c.function && c.function.name) call.function.name = c.function.name;
        if (c.function && c.function.arguments) call.function.arguments += c.function.arguments;
        p.tools.textContent = calls.map((k) => `[tool call] ${k.function.name}(${k.function.arguments})`).join('\n');
      }
      out.scrollIntoView({ block: 'end' });
    }
  } catch (e) {
    if (e.name === 'AbortError' || e.code === 'ABORTED') stopped = true;
    else bubble('error', String(e.message || e));
  } finally {
    controller = null;
    $('send').textContent = 'Send';
    p.reasoning.open = false;
    if (content || reasoning || calls.length) {
      const stats = document.createElement('div');
      stats.className = 'stats';
      const n = usage ? usage.completion_tokens : null;
      // Decode speed: tokens after the first over the time since the first arrived.
      const tps = n > 1 && last > first ? ((n - 1) * 1000) / (last - first) : null;
      stats.textContent = usage
        ? `${usage.prompt_tokens} prompt tokens` +
          (usage.prompt_tokens_details ? ` (${usage.prompt_tokens_details.cached_tokens} cached)` : '') +
          `, ${n} generated` + (tps ? `, ${tps.toFixed(1)} tok/s` : '')
        : '';
      if (stopped) {
        const mark = document.createElement('div');
        mark.className = 'stopped';
        mark.textContent = 'stopped';
        out.appendChild(mark);
      }
      if (usage) out.appendChild(stats);
      const turn = { role: 'assistant', content };
      if (reasoning) turn.reasoning_content = reasoning;
      if (calls.length) turn.tool_calls = calls.filter(Boolean);
      conv.messages.push(turn);
      // Without IndexedDB (some private modes) the conversation still works, unsaved.
      await save(conv).catch((e) => console.warn('tinyllm chat: conversation not saved:', e));
    } else {
      // Nothing came back (an error or an early stop): no empty bubble, and no empty turn
      // sent with the next message.
      out.remove();
      conv.messages.pop();
    }
  }
}

// ---- the worker's model picker

async function loadModel(source, label) {
  const row = $('progress-row');
  row.hidden = false;
  $('progress').value = 0;
  $('progress-text').textContent = `loading ${label}`;
  $('load').disabled = true;
  $('model').textContent = '';
  try {
    await transport.load(source, $('backend').value, (pr) => {
      if (pr.total > 0) $('progress').value = pr.loaded / pr.total;
      $('progress-text').textContent =
        `${pr.phase === 'download' ? 'downloading' : 'loading'} ${(pr.loaded / 1e6).toFixed(1)} / ${(pr.total / 1e6).toFixed(1)} MB, ${pr.mbps.toFixed(1)} MB/s`;
    });
    $('progress').value = 1;
    $('progress-text').textContent += ' — ready';
    $('model').textContent = await transport.label();
  } catch (e) {
    $('progress-text').textContent = '';
    row.hidden = true;
    bubble('error', `${e.code ? e.code + ': ' : ''}${e.message || e}`);
  } finally {
    $('load').disabled = false;
  }
}

// ---- wiring

$('form').addEventListener('submit', (ev) => {
  ev.preventDefault();
  if (controller) {
    controller.abort();
    return;
  }
  const text = $('input').value.trim();
  if (!text) return;
  if (!transport || !transport.ready) {
    bubble('error', 'load a model first');
    return;
  }
  $('input').value = '';
  send(text);
});
$('input').addEventListener('keydown', (ev) => {
  if (ev.key === 'Enter' && !ev.shiftKey) {
    ev.preventDefault();
    $('form').requestSubmit();
  }
});
$('clear').addEventListener('click', () => startConversation(newConversation()));
$('load-form').addEventListener('submit', (ev) => {
  ev.preventDefault();
  const file = $('model-file').files[0];
  const url = $('model-url').value.trim();
  if (file) loadModel(file, file.name);
  else if (url) loadModel(url, url);
});

transport = await pickTransport();
document.body.dataset.transport = transport.kind;
$('transport').textContent = transport.kind === 'http' ? 'server' : 'in this tab';
for (const el of document.querySelectorAll('.http-only')) el.hidden = transport.kind !== 'http';
for (const el of document.querySelectorAll('.worker-only')) el.hidden = transport.kind !== 'worker';
await listConversations().catch((e) => console.warn('tinyllm chat: no IndexedDB:', e));
if (transport.kind === 'http') {
  transport.label().then((l) => ($('model').textContent = l)).catch(() => {});
} else {
  if (params.get('backend')) $('backend').value = params.get('backend');
  if (params.get('model')) {
    $('model-url').value = params.get('model');
    loadModel(params.get('model'), params.get('model'));
  }
}
// For tests and embedding pages: the transport in use.
window.tinyllmChat = { transport };
