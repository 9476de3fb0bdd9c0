// A minimal app on the tinyllm package: load a GGUF from a URL, stream an answer to a prompt
// through the OpenAI-shaped API, stop it.
import { TinyLLM } from 'tinyllm';

const $ = (id) => document.getElementById(id);
let llm = null;
let controller = null;

const params = new URLSearchParams(location.search);
if (params.get('model')) $('url').value = params.get('model');
if (params.get('backend')) $('backend').value = params.get('backend');

$('load').addEventListener('click', async () => {
  $('ask').disabled = true;
  try {
    if (llm) await llm.unload();
    llm = await TinyLLM.load($('url').value, {
      backend: $('backend').value,
      onProgress: (p) => ($('status').textContent = `${p.phase} ${(p.loaded / 1e6).toFixed(1)} / ${(p.total / 1e6).toFixed(1)} MB`),
    });
    $('status').textContent = `ready: ${llm.info.name} on ${llm.info.backend}`;
    $('ask').disabled = false;
  } catch (e) {
    $('status').textContent = `error ${e.code}: ${e.message}`;
  }
});

$('ask').addEventListener('click', async () => {
  controller = new AbortController();
  $('ask').disabled = true;
  $('stop').disabled = false;
  $('output').textContent = '';
  try {
    const stream = await llm.chat.completions.create({
      messages: [{ role: 'user', content: $('prompt').value }],
      stream: true,
      temperature: 0,
      max_tokens: Number(params.get('max_tokens') || 256),
      signal: controller.signal,
    });
    for await (const chunk of stream) $('output').textContent += chunk.choices[0]?.delta?.content ?? '';
    $('status').textContent = 'done';
  } catch (e) {
    $('status').textContent = e.code === 'ABORTED' ? 'stopped' : `error ${e.code}: ${e.message}`;
  } finally {
    $('ask').disabled = false;
    $('stop').disabled = true;
  }
});

$('stop').addEventListener('click', () => controller && controller.abort());

// For tests: the loaded model, to compare the streamed answer with a whole one.
window.example = { get llm() { return llm; } };
