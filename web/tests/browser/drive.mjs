// Runs one scenario of the browser tests: headless Chromium (WebGPU through SwiftShader, as
// docs/design.md says) opens PAGE and calls `window.scenarios[NAME](ARGS)`; the JSON result goes to
// stdout as the last line, console output of the page to stderr. Screenshots named by the
// scenario's result (`screenshot: path`) are taken after it ran.
//
//   node drive.mjs PAGE_URL NAME ARGS_JSON
import { chromium } from 'playwright-core';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const [url, name, args] = process.argv.slice(2);
const profile = mkdtempSync(join(tmpdir(), 'tinyllm-chromium-'));
const browser = await chromium.launchPersistentContext(profile, {
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  headless: true,
  args: [
    '--no-sandbox', '--disable-gpu-sandbox', '--enable-unsafe-webgpu', '--enable-features=Vulkan',
    '--disable-quic', '--no-first-run', '--disable-background-networking', '--disable-component-update',
    '--disable-sync', '--enable-blink-features=ForceEagerMeasureMemory',
  ],
});
const page = browser.pages()[0] || (await browser.newPage());
page.on('console', (m) => console.error(`[page ${m.type()}] ${m.text()}`));
page.on('pageerror', (e) => console.error(`[page error] ${e.message}`));
let code = 0;
try {
  await page.goto(url);
  await page.waitForFunction(() => window.scenarios !== undefined, null, { timeout: 30000 });
  const result = await page.evaluate(([n, a]) => window.scenarios[n](a, window), [name, JSON.parse(args)]);
  process.stdout.write(JSON.stringify(result) + '\n');
} catch (e) {
  console.error(`scenario ${name} failed: ${e.stack || e}`);
  code = 1;
} finally {
  await browser.close();
}
process.exit(code);
