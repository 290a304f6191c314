// Helper of test_indicator_model.js, run as a user who may not hold the GPU: starts the indicator's client, turns
// the "Keep off the GPU" toggle on, and prints the resulting view (presentation.js) as JSON on the last line.
import GLib from 'gi://GLib';
import System from 'system';

// run_model_test.sh copies this file next to the built extension (a static import: a loop run under a top-level
// await would never see its promises settle).
import {TandemClient} from './tandem@tandem.io/tandemClient.js';
import * as P from './tandem@tandem.io/presentation.js';

const dir = GLib.getenv('EXT_DIR');
const client = new TandemClient({extensionDir: dir});
const loop = new GLib.MainLoop(null, false);
let code = 1;
client.start().then(async () => {
    for (let i = 0; i < 100 && !client.present; i++)
        await new Promise(r => GLib.timeout_add(GLib.PRIORITY_DEFAULT, 50, () => r() ?? GLib.SOURCE_REMOVE));
    const snap = await client.setHold(true);
    print(JSON.stringify(P.present(snap)));
    code = 0;
}).catch(e => printerr(`probe: ${e}`)).finally(() => loop.quit());
loop.run();
client.destroy();
System.exit(code);
