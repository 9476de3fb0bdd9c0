// Drives the Vite example app (web/example, built into dist/) in headless Chromium:
//   node example.mjs URL
// URL opens the app with ?model=...&backend=...&max_tokens=...; the script loads the model
// through the page, asks, waits for the streamed answer and checks it equals the package's
// whole (non-streamed) answer to the same request. Prints the answer; exits non-zero on failure.
import { chromium } from 'playwright-core';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const url = process.argv[2];
const profile = mkdtempSync(join(tmpdir(), 'tinyllm-chromium-'));
const context = await chromium.launchPersistentContext(profile, {
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  headless: true,
  args: ['--no-sandbox', '--disable-gpu-sandbox', '--enable-unsafe-webgpu', '--enable-features=Vulkan', '--disable-quic',
    '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync'],
});
const problems = [];
let code = 0;
try {
  const page = context.pages()[0] || (await context.newPage());
  page.setDefaultTimeout(90_000);
  page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
  page.on('console', (m) => m.type() === 'error' && problems.push(`console error: ${m.text()}`));
  await page.goto(url);
  await page.click('#load');
  await page.waitForFunction(() => /^(ready|error)/.test(document.getElementById('status').textContent));
  const loaded = await page.textContent('#status');
  if (!loaded.startsWith('ready')) throw new Error(`load: ${loaded}`);
  await page.click('#ask');
  await page.waitForFunction(() => /^(done|stopped|error)/.test(document.getElementById('status').textContent));
  const status = await page.textContent('#status');
  const streamed = await page.textContent('#output');
  const whole = await page.evaluate(async () => {
    const r = await window.example.llm.chat.completions.create({
      messages: [{ role: 'user', content: document.getElementById('prompt').value }],
      temperature: 0,
      max_tokens: Number(new URLSearchParams(location.search).get('max_tokens')),
    });
    return r.choices[0].message.content;
  });
  if (status !== 'done') throw new Error(`ask: ${status}`);
  if (streamed.length === 0 || streamed !== whole) throw new Error(`streamed ${JSON.stringify(streamed)}, whole ${JSON.stringify(whole)}`);
  if (problems.length) throw new Error(problems.join('\n'));
  console.log(`${loaded}; answer ${JSON.stringify(streamed)}`);
  console.log('example: ok');
} catch (e) {
  console.error(`example failed: ${e.stack || e}`);
  code = 1;
} finally {
  await context.close();
  rmSync(profile, { recursive: true, force: true });
}
process.exit(code);
