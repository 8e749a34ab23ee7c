// Regenerates docs/tracking-runs.png: the MLflow UI's runs list of the digits loop,
// the parent run expanded to its nested trials, with provenance tags as columns.
// Plain `chromium --headless --screenshot` cannot expand a parent run, so this drives
// Debian's chromium with playwright-core (a dev tool; nothing in the tests needs it):
//
//   apt-get install -y chromium && npm install --prefix /tmp/pw node@22 playwright-core
//   AUTORESEARCH_HOME=/tmp/shot autoresearch examples/digits/plan.yaml && sleep 20
//   AUTORESEARCH_HOME=/tmp/shot autoresearch ui --port 5078 &
//   /tmp/pw/node_modules/node/bin/node docs/screenshots.js \
//       "http://127.0.0.1:5078/#/experiments/1/runs" docs/tracking-runs.png
//
// The tag columns, left to right: decision_id, role, parent_trial, proposer, trial_state, seed.
const { chromium } = require(process.env.PLAYWRIGHT || '/tmp/pw/node_modules/playwright-core');
(async () => {
  const browser = await chromium.launch({ executablePath: '/usr/bin/chromium', args: ['--no-sandbox', '--disable-gpu',
    '--disable-background-networking', '--disable-component-update', '--disable-sync', '--no-first-run'] });
  const page = await browser.newPage({ viewport: { width: 1600, height: 900 } });
  await page.goto(process.argv[2]);
  await page.waitForTimeout(7000);
  await page.mouse.click(1564, 35);  // close the assistant side panel
  await page.waitForTimeout(800);
  const row = page.getByRole('row').filter({ hasText: 'digits-mlp' }).first();
  await row.locator('button').first().click();  // expand the parent run
  await page.waitForTimeout(2000);
  await page.getByRole('button', { name: /Columns/ }).click();
  await page.waitForTimeout(1000);
  for (const off of ['Dataset', 'Source', 'Models']) {
    try { await page.getByText(off, { exact: true }).last().click({ timeout: 3000 }); } catch (e) { console.log('miss', off); }
  }
  const search = page.getByPlaceholder('Search columns');
  for (const w of ['val_loss', 'autoresearch.role', 'autoresearch.proposer', 'autoresearch.decision_id',
                   'autoresearch.parent_trial', 'autoresearch.trial_state', 'autoresearch.seed']) {
    await search.fill(w);
    await page.waitForTimeout(700);
    try { await page.getByText(w, { exact: true }).last().click({ timeout: 3000 }); } catch (e) { console.log('miss', w); }
  }
  await search.fill('');
  await page.keyboard.press('Escape');
  await page.waitForTimeout(2500);
  await page.screenshot({ path: process.argv[3] });
  await browser.close();
})();
