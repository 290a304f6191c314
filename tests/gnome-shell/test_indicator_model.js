// The GNOME Shell indicator's model and presentation (clients/gnome-shell/src/tandemClient.js, presentation.js)
// in plain gjs, against a real tandemd (simulated GPU, --testing) on a private bus that stands in for the system
// bus (DBUS_SYSTEM_BUS_ADDRESS). Every step asserts the texts and icons the indicator would show.
// Run by run_model_test.sh, which provides the bus, the model and the configuration:
//   EXT_DIR (the built ESM extension), LEGACY_DIR (the built legacy one), TANDEMD, TANDEMCTL, TANDEM_CONFIG,
//   T_DIR, DBUS_SYSTEM_BUS_ADDRESS.

import Gio from 'gi://Gio';
import GLib from 'gi://GLib';
import System from 'system';

// run_model_test.sh copies this file next to the built extension (a static import: a loop run under a top-level
// await would never see its promises settle).
import {TandemClient} from './tandem@tandem.io/tandemClient.js';
import * as P from './tandem@tandem.io/presentation.js';

const env = k => {
    const v = GLib.getenv(k);
    if (!v)
        throw new Error(`${k} is not set`);
    return v;
};
const EXT_DIR = env('EXT_DIR');

const ADDR = env('DBUS_SYSTEM_BUS_ADDRESS');
const T_DIR = env('T_DIR');
let failures = 0;
let checks = 0;
const figures = [];
const t0 = GLib.get_monotonic_time();
const stamp = () => `[${((GLib.get_monotonic_time() - t0) / 1e6).toFixed(1)}s]`;
const note = msg => print(`# ${stamp()} ${msg}`);

function check(cond, what, detail = '') {
    checks++;
    if (cond)
        return;
    failures++;
    printerr(`FAIL: ${what}${detail ? `: ${detail}` : ''}`);
}
function eq(got, want, what) {
    check(got === want, what, `got ${JSON.stringify(got)}, want ${JSON.stringify(want)}`);
}
function has(text, part, what) {
    check(typeof text === 'string' && text.includes(part), what, `${JSON.stringify(text)} lacks ${JSON.stringify(part)}`);
}

const sleep = ms => new Promise(r => GLib.timeout_add(GLib.PRIORITY_DEFAULT, ms, () => {
    r();
    return GLib.SOURCE_REMOVE;
}));

// --- the daemon, and a second connection for the Testing interface (as the test's user: root = admin) ----------
let daemon = null;
function startDaemon() {
    const launcher = new Gio.SubprocessLauncher({flags: Gio.SubprocessFlags.NONE});
    launcher.set_stderr_file_path(`${T_DIR}/tandemd.${Date.now()}.log`);
    daemon = launcher.spawnv([env('TANDEMD'), '--config', env('TANDEM_CONFIG'), '--testing', '--log-stderr']);
    GLib.file_set_contents(`${T_DIR}/daemon.pid`, daemon.get_identifier());  // for the script's cleanup
}
function stopDaemon() {
    return new Promise(resolve => {
        const d = daemon;
        daemon = null;
        d.send_signal(15);
        d.wait_async(null, () => resolve());
    });
}
const testBus = Gio.DBusConnection.new_for_address_sync(ADDR,
    Gio.DBusConnectionFlags.AUTHENTICATION_CLIENT | Gio.DBusConnectionFlags.MESSAGE_BUS_CONNECTION, null, null);
function testing(method, sig = null, args = null) {
    return new Promise((resolve, reject) => {
        testBus.call('io.tandem.Tandem1', '/io/tandem/Tandem1', 'io.tandem.Tandem1.Testing', method,
            sig ? new GLib.Variant(sig, args) : null, null, Gio.DBusCallFlags.NONE, -1, null, (c, res) => {
                try {
                    resolve(c.call_finish(res));
                } catch (e) {
                    reject(e);
                }
            });
    });
}
function daemonHolds() {
    return new Promise((resolve, reject) => {
        testBus.call('io.tandem.Tandem1', '/io/tandem/Tandem1', 'org.freedesktop.DBus.Properties', 'Get',
            new GLib.Variant('(ss)', ['io.tandem.Tandem1', 'Holds']), null, Gio.DBusCallFlags.NONE, -1, null,
            (c, res) => {
                try {
                    resolve(c.call_finish(res).recursiveUnpack()[0]);
                } catch (e) {
                    reject(e);
                }
            });
    });
}

// --- the client under test -----------------------------------------------------------------------------------------
const client = new TandemClient({extensionDir: EXT_DIR, appId: 'org.gnome.Shell', holdReason: 'test hold'});
let view = P.present(client.snapshot());
let viewUpdates = 0;
const notifications = [];
const notifier = new P.Notifier();  // as indicator.js uses it
client.connect('changed', snap => {
    if (!snap.present)
        notifier.reset();
    view = P.present(snap);
    viewUpdates++;
});
client.connect('degraded-mode-changed', signal => {
    const n = notifier.signal(signal, {ownHoldOnly: client.ownHoldOnly()});
    if (n) {
        notifications.push(n);
        note(`notification: ${n.title} — ${n.body}`);
    }
});

// Waits until pred(view) holds; returns the milliseconds from `since` (monotonic µs) to the update that made it
// true. Resolution: the main loop's; the test fails after timeoutMs.
function waitView(pred, what, timeoutMs = 15000, since = GLib.get_monotonic_time()) {
    return new Promise(resolve => {
        if (pred(view)) {
            resolve(0);
            return;
        }
        const deadline = GLib.get_monotonic_time() + timeoutMs * 1000;
        const id = client.connect('changed', () => {
            if (pred(view)) {
                client.disconnect(id);
                GLib.source_remove(timer);
                resolve((GLib.get_monotonic_time() - since) / 1000);
            }
        });
        const timer = GLib.timeout_add(GLib.PRIORITY_DEFAULT, 50, () => {
            if (GLib.get_monotonic_time() < deadline)
                return GLib.SOURCE_CONTINUE;
            client.disconnect(id);
            check(false, `timed out after ${timeoutMs} ms waiting for ${what}`,
                `view: ${JSON.stringify({state: view.state, subtitle: view.subtitle, headline: view.headline})}`);
            resolve(-1);
            return GLib.SOURCE_REMOVE;
        });
    });
}

function dump(label) {
    note(`${label}: icon=${view.iconName} panel=${view.panelVisible} subtitle="${view.subtitle}"`);
    print(`#   headline: ${view.headline}`);
    for (const l of [view.memory ? view.memory.caption : view.memoryNote, ...view.models.map(m => m.text),
        ...view.queues.map(q => q.text), view.breaker, ...view.holds.map(h => h.text), view.holdNote].filter(x => x))
        print(`#   ${l}`);
}

async function main() {
    // 1. tandemd is not on the bus: the indicator is hidden (panel) and greyed (toggle).
    await client.start();
    note(`interface XML: ${client.interfacePath}`);
    eq(view.panelVisible, false, 'no daemon: panel icon hidden');
    eq(view.sensitive, false, 'no daemon: toggle greyed');
    eq(view.iconName, P.Icons.absent, 'no daemon: icon');
    eq(view.subtitle, 'Not running', 'no daemon: subtitle');
    dump('no daemon');

    // 2. tandemd appears: normal.
    startDaemon();
    await waitView(v => v.state === 'normal' && v.models.length > 0, 'tandemd to appear (normal, models read)', 30000);
    eq(view.panelVisible, true, 'normal: panel icon shown');
    eq(view.iconName, P.Icons.normal, 'normal: icon');
    eq(view.subtitle, 'On the GPU', 'normal: subtitle');
    eq(view.headline, 'Running on the GPU at full speed.', 'normal: headline');
    check(view.memory !== null, 'normal: a memory bar');
    has(view.memory && view.memory.caption, 'GPU memory (1.0 GiB): Tandem ', 'normal: memory caption');
    has(view.memory && view.memory.caption, 'other apps 0 KiB', 'normal: no foreign load');
    const sum = view.memory ? view.memory.segments.reduce((a, s) => a + s.fraction, 0) : 0;
    check(Math.abs(sum - 1) < 1e-9, 'memory bar segments add up to the whole', String(sum));
    eq(view.models.length, 1, 'one model');
    has(view.models[0] && view.models[0].text, 'default (default model): GPU: all ', 'model line: on the GPU');
    has(view.models[0] && view.models[0].text, 'CPU copy read from disk when needed', 'model line: the mmap CPU copy');
    eq(view.queues.map(q => q.text).join(' | '), 'GPU queue: idle | CPU queue: idle', 'queues idle');
    eq(view.breaker, 'GPU health: good', 'breaker closed');
    eq(view.holds.length, 0, 'no holds');
    dump('normal');

    // 3. foreign load: pressure (memory-critical), no notification.
    let since = GLib.get_monotonic_time();
    await testing('SetForeignLoad', '(t)', [900000000]);
    let ms = await waitView(v => v.state === 'pressure', 'pressure', 15000, since);
    figures.push(`foreign load → pressure shown: ${ms.toFixed(0)} ms`);
    eq(view.iconName, P.Icons.pressure, 'pressure: icon');
    eq(view.subtitle, 'GPU memory tight', 'pressure: subtitle');
    has(view.headline, 'GPU memory is ', 'pressure: headline names the memory');
    await waitView(v => v.memory && v.memory.caption.includes('other apps 858 MiB'), 'the foreign load in the bar');
    dump('pressure');
    await testing('SetForeignLoad', '(t)', [0]);
    await waitView(v => v.state === 'normal', 'normal after the foreign load');
    eq(notifications.length, 0, 'no notification for pressure');

    // 4. device lost: degraded, one notification with the reason; back: one notification.
    since = GLib.get_monotonic_time();
    await testing('LoseDevice');
    ms = await waitView(v => v.state === 'degraded', 'degraded after LoseDevice', 15000, since);
    figures.push(`LoseDevice → degraded shown: ${ms.toFixed(0)} ms`);
    eq(view.iconName, P.Icons.degraded, 'degraded: icon');
    has(view.subtitle, 'On the CPU, ', 'degraded: subtitle');
    has(view.headline, 'because the GPU is not available', 'degraded: headline gives the reason in words');
    await waitView(v => v.models.length && v.models[0].text.includes('GPU copy lost'), 'model line: GPU copy lost');
    eq(view.memory, null, 'degraded: no memory bar without a device');
    eq(view.memoryNote, 'No GPU memory reading: the GPU is not available.', 'degraded: memory note');
    await waitView(v => v.breaker.startsWith('GPU health: it failed recently'), 'breaker open in words');
    dump('degraded (device lost)');
    await sleep(300);
    eq(notifications.length, 1, 'one notification when degraded mode starts');
    eq(notifications[0] && notifications[0].title, 'Tandem is running on the CPU', 'notification title');
    has(notifications[0] && notifications[0].body, 'The GPU is not available', 'notification names the reason');
    has(notifications[0] && notifications[0].body, 'slower', 'notification gives the slowdown');

    since = GLib.get_monotonic_time();
    await testing('RecoverDevice');
    ms = await waitView(v => v.state === 'normal', 'normal after RecoverDevice', 30000, since);
    figures.push(`RecoverDevice → normal shown: ${ms.toFixed(0)} ms (includes the breaker's probes and recover_after_ms)`);
    await waitView(v => v.models.length && v.models[0].text.includes('GPU: all'), 'model back on the GPU');
    await sleep(300);
    eq(notifications.length, 2, 'one notification when degraded mode ends');
    eq(notifications[1] && notifications[1].title, 'Tandem is back on the GPU', 'end notification');

    // 5. a hold from another process (Steam): shown by name, state degraded (gpu-held).
    const holder = Gio.Subprocess.new([env('TANDEMCTL'), '--address', ADDR, 'hold', '--app-id',
        'com.valvesoftware.Steam', '--for', '60', 'game running'], Gio.SubprocessFlags.STDOUT_SILENCE |
        Gio.SubprocessFlags.STDERR_SILENCE);
    await waitView(v => v.holds.length === 1, 'the other process\'s hold');
    eq(view.holds[0] && view.holds[0].text, 'Held by Steam: game running', 'another app\'s hold in words');
    eq(view.checked, false, 'another app\'s hold does not check our toggle');
    await waitView(v => v.state === 'degraded', 'degraded while held');
    has(view.headline, 'because an app asked to keep the GPU free', 'held: headline');
    // The hold gave the GPU copy back (evict_on_hold), and the model line says to whom.
    await waitView(v => v.models.length && v.models[0].text.includes('GPU copy given back to Steam'),
        'model line: GPU copy given back to Steam');
    dump('held by another process');
    holder.send_signal(9);  // killed: tandemd drops the hold when its bus name vanishes
    await waitView(v => v.holds.length === 0, 'the killed holder\'s hold to go');
    await waitView(v => v.state === 'normal', 'normal after the other hold');

    // 6. our own hold: the toggle; tandemd's Holds lists it; released by the toggle.
    since = GLib.get_monotonic_time();
    const turnedOn = client.setHold(true);
    eq(P.present(client.snapshot()).holdSwitch.sensitive, false, 'the switch is insensitive while the call runs');
    await turnedOn;
    ms = await waitView(v => v.checked && v.holds.some(h => h.own), 'our hold', 10000, since);
    figures.push(`toggle on → hold shown: ${ms.toFixed(0)} ms`);
    const cookie = client.snapshot().ownHold;
    const holds = await daemonHolds();
    check(holds.some(h => h[0] === cookie && h[1] === 'org.gnome.Shell' && h[2] === 'test hold'),
        'tandemd lists our hold (cookie, app id, reason)', JSON.stringify(holds));
    eq(view.subtitle, 'Kept off the GPU', 'held: toggle subtitle');
    eq(view.holdSwitch.checked, true, 'held: switch on');
    eq(view.holds.find(h => h.own).text, 'Kept off the GPU by you (this session)', 'our hold in words');
    await waitView(v => v.state === 'degraded', 'degraded by our hold');
    await waitView(v => v.models.length && v.models[0].text.includes('GPU copy given back to you'),
        'model line: GPU copy given back to you');
    dump('held by us');
    await client.setHold(false);
    await waitView(v => !v.checked && v.holds.length === 0, 'our hold released');
    eq((await daemonHolds()).length, 0, 'tandemd has no hold after the toggle went off');
    await waitView(v => v.state === 'normal', 'normal after our hold');
    await waitView(v => v.models.length && v.models[0].text.includes('GPU: all'), 'model back on the GPU after our hold');

    // 7. a user who may not hold: the toggle explains which group to join (a second gjs process as nobody).
    const probe = GLib.getenv('PROBE_AS_NOBODY');
    if (probe) {
        const p = Gio.Subprocess.new(['sh', '-c', probe], Gio.SubprocessFlags.STDOUT_PIPE);
        const [, out] = await new Promise(r => p.communicate_utf8_async(null, null, (s, res) => r(s.communicate_utf8_finish(res))));
        let v = null;
        try {
            v = JSON.parse(out.trim().split('\n').pop());
        } catch (e) {
            check(false, 'the unauthorized probe printed its view', out);
        }
        if (v) {
            eq(v.checked, false, 'not authorized: toggle stays off');
            eq(v.subtitle, 'Needs group tandem-it-nogroup', 'not authorized: toggle subtitle names the group');
            has(v.holdNote, 'Only members of the group “tandem-it-nogroup” may keep Tandem off the GPU',
                'not authorized: the note');
            has(v.holdNote, 'sudo adduser nobody tandem-it-nogroup', 'not authorized: the command');
            note(`not authorized: ${v.subtitle} / ${v.holdNote}`);
        }
    } else {
        note('SKIP the unauthorized-user check (needs root to run a process as nobody)');
    }

    // 8. tandemd stops, with our hold on: the indicator greys out and forgets the hold; it comes back.
    await client.setHold(true);
    await waitView(v => v.checked, 'our hold before the stop');
    since = GLib.get_monotonic_time();
    const stopped = stopDaemon();
    ms = await waitView(v => v.state === 'absent', 'the indicator after tandemd stopped', 15000, since);
    figures.push(`SIGTERM to tandemd → "Not running" shown: ${ms.toFixed(0)} ms (drain and exit included)`);
    await stopped;
    eq(view.panelVisible, false, 'stopped: panel icon hidden');
    eq(view.sensitive, false, 'stopped: toggle greyed');
    eq(view.subtitle, 'Not running', 'stopped: subtitle');
    eq(view.checked, false, 'stopped: our hold is gone with the daemon');
    dump('tandemd stopped');
    startDaemon();
    await waitView(v => v.state === 'normal' && v.models.length > 0, 'tandemd back', 30000);
    eq(view.subtitle, 'On the GPU', 'restarted: subtitle');
    eq((await daemonHolds()).length, 0, 'restarted: no hold');

    // 8b. a model added to the configuration and reloaded (SIGHUP): the indicator lists it on ModelsChanged, with no
    // restart; taken out again, it goes from the list.
    const cfgPath = env('TANDEM_CONFIG');
    const cfgText = new TextDecoder().decode(GLib.file_get_contents(cfgPath)[1]);
    const modelDir = (cfgText.match(/^dir = "(.*)"$/m) || [])[1];
    check(!!modelDir, 'the test config names the model dir');
    GLib.file_set_contents(cfgPath, `${cfgText}\n[[model]]\nname = "second"\ndir = "${modelDir}"\ngpu = false\n`);
    since = GLib.get_monotonic_time();
    daemon.send_signal(1);
    ms = await waitView(v => v.models.length === 2, 'the added model listed', 30000, since);
    figures.push(`SIGHUP adding a model → listed in the indicator: ${ms.toFixed(0)} ms (its load included)`);
    has(view.models.map(m => m.text).join(' | '), 'second', 'the added model in words');
    has(view.models.map(m => m.text).join(' | '), 'CPU', 'the added model: its CPU copy');
    GLib.file_set_contents(cfgPath, cfgText);
    daemon.send_signal(1);
    await waitView(v => v.models.length === 1, 'the removed model gone from the list', 30000);
    eq(view.state, 'normal', 'adding and removing a model leaves the service normal');

    // 9. notifications: device lost, back, Steam's hold, back. None for pressure, for this session's own hold (the
    // user did it), for the daemon leaving while degraded or for its return.
    eq(notifications.map(x => x.title).join(' | '), 'Tandem is running on the CPU | Tandem is back on the GPU | ' +
        'Tandem is running on the CPU | Tandem is back on the GPU', 'notifications, once per change');

    // 10. disable(): every listener dropped, the proxy released, our hold released.
    await client.setHold(true);
    await waitView(v => v.checked, 'a hold before destroy');
    const before = viewUpdates;
    client.destroy();
    await waitView(() => true, '');
    let released = false;
    for (let i = 0; i < 50 && !released; i++) {
        released = (await daemonHolds()).length === 0;
        if (!released)
            await sleep(100);
    }
    check(released, 'destroy() released our hold');
    await testing('SetForeignLoad', '(t)', [900000000]);
    await sleep(700);
    eq(viewUpdates, before, 'no update reaches a destroyed client');
    eq(client._proxy, null, 'destroy() dropped the proxy');
    eq(client._listeners.size, 0, 'destroy() dropped the listeners');
    await testing('SetForeignLoad', '(t)', [0]);

    // 11. the presentation of states tandemd cannot be driven into here (unavailable needs a model without a CPU
    // replica; every configured model has one), and the legacy build gives the same views as the ESM one.
    const synthetic = {
        present: true, state: 'unavailable', degradedReason: 'gpu-breaker-open', breaker: 'open',
        memory: {present: false}, queues: [{name: 'gpu', depth: 3, capacity: 16, running: 1, concurrency: 1,
            oldest_age_ms: 65000}], holds: [], models: [], slowdown: 0, ownHold: null,
    };
    const u = P.present(synthetic);
    eq(u.iconName, P.Icons.unavailable, 'unavailable: icon');
    eq(u.subtitle, 'Not serving', 'unavailable: subtitle');
    eq(u.headline, 'Not serving: the GPU failed recently and is paused, and there is no CPU copy to fall back to.',
        'unavailable: headline');
    eq(u.queues[0].text, 'GPU queue: 1 running, 3 waiting (the oldest for 1 minute)', 'a busy queue in words');
    const nf = new P.Notifier();
    check(nf.signal({degraded: true, reason: 'gpu-absent', details: {level: 'degraded', expected_slowdown: 2.5}})
        !== null, 'normal → degraded notifies');
    eq(nf.signal({degraded: true, reason: 'gpu-breaker-open', details: {level: 'degraded'}}), null,
        'a new reason at the same level does not notify');
    const nu = nf.signal({degraded: true, reason: 'gpu-absent', details: {level: 'unavailable'}});
    eq(nu && nu.title, 'Tandem has stopped answering', 'degraded → unavailable notifies');
    eq(nf.signal({degraded: true, reason: 'gpu-absent', details: {level: 'unavailable'}}), null,
        'a repeated level does not notify');
    eq(P.formatSlowdown(2.13), 'about 2.1× slower', 'slowdown in words');

    const legacyDir = GLib.getenv('LEGACY_DIR');
    if (legacyDir) {
        const snaps = [synthetic, client.snapshot(), {present: false}];
        GLib.file_set_contents(`${T_DIR}/snaps.json`, JSON.stringify(snaps));
        const js = `imports.searchPath.unshift(${JSON.stringify(legacyDir)});
            const P = imports.presentation;
            const [, b] = imports.gi.GLib.file_get_contents(${JSON.stringify(`${T_DIR}/snaps.json`)});
            print(JSON.stringify(JSON.parse(new TextDecoder().decode(b)).map(s => P.present(s))));
            const C = imports.tandemClient;
            if (typeof C.TandemClient !== 'function' || typeof imports.indicator.createIndicator !== 'function')
                throw new Error('legacy exports missing');`;
        const p = Gio.Subprocess.new(['gjs', '-c', js], Gio.SubprocessFlags.STDOUT_PIPE);
        const [, out] = await new Promise(r => p.communicate_utf8_async(null, null, (s, res) => r(s.communicate_utf8_finish(res))));
        eq(out.trim(), JSON.stringify(snaps.map(s => P.present(s))), 'the legacy (Shell 43/44) build presents the same');
    }

    // The entry points cannot run outside a Shell; check that both parse (ESM: with its import lines removed).
    for (const [dir, file] of [[EXT_DIR, 'extension.js'], [legacyDir, 'extension.js'], [legacyDir, 'indicator.js']]) {
        if (!dir)
            continue;
        let src = new TextDecoder().decode(GLib.file_get_contents(`${dir}/${file}`)[1]);
        if (dir === EXT_DIR)
            src = src.replace(/^import .*;$/mg, '').replace(/^export (default )?/mg, '');
        try {
            // eslint-disable-next-line no-new-func
            new Function(src);
        } catch (e) {
            check(false, `${dir}/${file} parses`, String(e));
        }
    }

    if (daemon)
        await stopDaemon();
}

const loop = new GLib.MainLoop(null, false);
let exitCode = 0;
main().catch(e => {
    printerr(`FAIL: ${e}\n${e.stack}`);
    failures++;
}).finally(() => {
    for (const f of figures)
        print(`figure: ${f}`);
    print(`${checks} checks, ${failures} failed`);
    exitCode = failures ? 1 : 0;
    if (daemon) {
        daemon.send_signal(9);
        daemon = null;
    }
    loop.quit();
});
loop.run();
System.exit(exitCode);
