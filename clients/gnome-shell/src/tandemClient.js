// The Tandem indicator's model: tandemd's state as seen on the system bus, kept live by D-Bus signals only
// (PropertiesChanged, DegradedModeChanged, ModelsChanged, and the bus name's owner), never by polling. No Shell code here, so plain
// gjs runs it against a real tandemd (tests/gnome-shell/).
//
// Shared by both GNOME generations: this is the ES-module form (Shell 45+); build.sh rewrites the gi imports and
// removes `export` for the legacy `imports` loader of Shell 43/44.

import Gio from 'gi://Gio';
import GLib from 'gi://GLib';

export const BUS_NAME = 'io.tandem.Tandem1';
export const OBJECT_PATH = '/io/tandem/Tandem1';
export const IFACE = 'io.tandem.Tandem1';
export const MODEL_IFACE = 'io.tandem.Tandem1.Model';

// The interface XML: the one installed by tandem-dev (<datadir>/dbus-1/interfaces, any XDG data dir), else the copy
// that build.sh put next to the extension (from the same dbus/*.xml of the source tree).
export function loadInterfaces(extensionDir) {
    const dirs = GLib.get_system_data_dirs().map(d => GLib.build_filenamev([d, 'dbus-1', 'interfaces']));
    if (extensionDir)
        dirs.push(GLib.build_filenamev([extensionDir, 'dbus']));
    const read = file => {
        for (const dir of dirs) {
            const path = GLib.build_filenamev([dir, file]);
            if (!GLib.file_test(path, GLib.FileTest.EXISTS))
                continue;
            const [, bytes] = GLib.file_get_contents(path);
            return {xml: new TextDecoder().decode(bytes), path};
        }
        throw new Error(`${file} not found in ${dirs.join(', ')}`);
    };
    const main = read('io.tandem.Tandem1.xml');
    const model = read('io.tandem.Tandem1.Model.xml');
    return {
        main: Gio.DBusNodeInfo.new_for_xml(main.xml).lookup_interface(IFACE),
        model: Gio.DBusNodeInfo.new_for_xml(model.xml).lookup_interface(MODEL_IFACE),
        path: main.path,
    };
}

// "…NotAuthorized: holding the GPU needs root or group 'tandem-admin'" → {kind, group, message}
export function classifyError(e) {
    const remote = Gio.DBusError.is_remote_error(e) ? Gio.DBusError.get_remote_error(e) : '';
    if (remote)
        Gio.DBusError.strip_remote_error(e);  // in place: "GDBus.Error:NAME: text" → "text"
    const message = e.message;
    if (remote === 'io.tandem.Tandem1.Error.NotAuthorized' || remote === 'org.freedesktop.DBus.Error.AccessDenied') {
        const m = /group '([^']+)'/.exec(message);
        return {kind: 'not-authorized', group: m ? m[1] : '', message, remote};
    }
    return {kind: 'failed', message, remote};
}

function unpackProp(proxy, name) {
    const v = proxy.get_cached_property(name);
    return v ? v.recursiveUnpack() : null;
}

export class TandemClient {
    // bus: a Gio.DBusConnection (default: the system bus). appId / holdReason: what HoldGpu tells tandemd.
    constructor({bus = null, extensionDir = null, appId = 'org.gnome.Shell', holdReason = null} = {}) {
        this._bus = bus;
        this._extensionDir = extensionDir;
        this._appId = appId;
        this._holdReason = holdReason || 'Keep off the GPU (GNOME Shell)';
        this._listeners = new Map();
        this._nextListener = 1;
        this._proxy = null;
        this._proxySignals = [];
        this._cancellable = new Gio.Cancellable();
        this._models = [];
        this._modelsSerial = 0;
        this._ownHold = null;
        this._holdBusy = false;
        this._holdError = null;
        this._slowdown = 0;
        this._destroyed = false;
        this.changes = 0;
        this.lastChangeTime = 0;
        this.interfacePath = null;
    }

    // Listeners: 'changed' (snapshot), 'degraded-mode-changed' ({degraded, reason, details}).
    connect(what, callback) {
        const id = this._nextListener++;
        this._listeners.set(id, {what, callback});
        return id;
    }

    disconnect(id) {
        this._listeners.delete(id);
    }

    _emit(what, arg) {
        for (const {what: w, callback} of [...this._listeners.values()]) {
            if (w !== what)
                continue;
            try {
                callback(arg);
            } catch (e) {
                logError(e, `tandem: ${what} listener`);
            }
        }
    }

    _changed() {
        if (this._destroyed)
            return;
        this.changes++;
        this.lastChangeTime = GLib.get_monotonic_time();
        this._emit('changed', this.snapshot());
    }

    // Creates the proxy (asynchronously; the Shell must never block). Resolves once it exists.
    start() {
        const ifaces = loadInterfaces(this._extensionDir);
        this._ifaces = ifaces;
        this.interfacePath = ifaces.path;
        const bus = this._bus || Gio.DBus.system;
        return new Promise((resolve, reject) => {
            Gio.DBusProxy.new(bus,
                // Looking at the panel must not start tandemd through bus activation.
                Gio.DBusProxyFlags.DO_NOT_AUTO_START,
                ifaces.main, BUS_NAME, OBJECT_PATH, IFACE, this._cancellable,
                (_o, res) => {
                    let proxy;
                    try {
                        proxy = Gio.DBusProxy.new_finish(res);
                    } catch (e) {
                        reject(e);
                        return;
                    }
                    if (this._destroyed) {
                        resolve();
                        return;
                    }
                    this._proxy = proxy;
                    this._proxySignals = [
                        proxy.connect('g-properties-changed', (_p, changed) => this._onPropertiesChanged(changed)),
                        proxy.connect('g-signal', (_p, _sender, name, params) => this._onSignal(name, params)),
                        proxy.connect('notify::g-name-owner', () => this._onOwnerChanged()),
                    ];
                    if (proxy.g_name_owner)
                        this._refreshModels();
                    this._changed();
                    resolve();
                });
        });
    }

    destroy() {
        if (this._destroyed)
            return;
        // The Shell's system bus connection outlives the extension: a hold it made would outlive it too.
        if (this._ownHold && this._proxy && this._proxy.g_name_owner) {
            this._proxy.call('ReleaseGpu', new GLib.Variant('(s)', [this._ownHold]),
                Gio.DBusCallFlags.NO_AUTO_START, -1, null, null);
        }
        this._destroyed = true;
        this._cancellable.cancel();
        if (this._proxy) {
            for (const id of this._proxySignals)
                this._proxy.disconnect(id);
        }
        this._proxySignals = [];
        this._proxy = null;
        this._listeners.clear();
        this._ownHold = null;
    }

    get present() {
        return !!(this._proxy && this._proxy.g_name_owner);
    }

    snapshot() {
        const p = this._proxy;
        if (!this.present) {
            return {present: false, ownHold: null, holdBusy: this._holdBusy, holdError: this._holdError,
                userName: GLib.get_user_name()};
        }
        const queues = (unpackProp(p, 'Queues') || []).map(
            ([name, depth, capacity, running, concurrency, oldestAgeMs]) =>
                ({name, depth, capacity, running, concurrency, oldest_age_ms: oldestAgeMs}));
        const holds = (unpackProp(p, 'Holds') || []).map(
            ([cookie, appId, reason, sinceUnixMs]) => ({cookie, app_id: appId, reason, since_unix_ms: sinceUnixMs}));
        return {
            present: true,
            version: unpackProp(p, 'Version') || '',
            state: unpackProp(p, 'State') || '',
            degradedReason: unpackProp(p, 'DegradedReason') || '',
            breaker: unpackProp(p, 'GpuBreaker') || '',
            memory: unpackProp(p, 'Memory') || null,
            queues,
            holds,
            fallbackModel: unpackProp(p, 'FallbackModel') || '',
            models: this._models,
            slowdown: this._slowdown,
            ownHold: this._ownHold,
            holdBusy: this._holdBusy,
            holdError: this._holdError,
            userName: GLib.get_user_name(),
        };
    }

    _onPropertiesChanged(changed) {
        const names = Object.keys(changed.deepUnpack());
        // Model objects do not announce their own changes (docs/dbus.md): re-read them when the service level,
        // the breaker, the fallback, the holds or the device's presence changes, which is when replicas move, and
        // with each new memory reading while a GPU copy is being given back or loaded (docs/residency.md).
        const moving = this._models.some(m => (m.replicas || []).some(r => r.state === 'draining' || r.state === 'loading'));
        if (names.some(n => ['State', 'DegradedReason', 'GpuBreaker', 'FallbackModel', 'Holds'].includes(n)))
            this._refreshModels();
        else if (names.includes('Memory')) {
            const present = !!(unpackProp(this._proxy, 'Memory') || {}).present;
            if (present !== this._lastPresent || moving)
                this._refreshModels();
        }
        if (names.includes('Holds') && this._ownHold) {
            // Our hold can end without us (tandemd restarted, an administrator removed it): follow Holds.
            const holds = unpackProp(this._proxy, 'Holds') || [];
            if (!holds.some(h => h[0] === this._ownHold))
                this._ownHold = null;
        }
        this._lastPresent = !!(unpackProp(this._proxy, 'Memory') || {}).present;
        this._changed();
    }

    _onSignal(name, params) {
        // A configuration reload added or removed models (docs/residency.md): the list and its objects changed.
        if (name === 'ModelsChanged') {
            this._refreshModels();
            return;
        }
        if (name !== 'DegradedModeChanged')
            return;
        const [degraded, reason, details] = params.recursiveUnpack();
        if (typeof details.expected_slowdown === 'number' && details.expected_slowdown > 0)
            this._slowdown = details.expected_slowdown;
        this._emit('degraded-mode-changed', {degraded, reason, details});
    }

    _onOwnerChanged() {
        // tandemd left (stopped, crashed) or came back. Its holds died with it; the new one has none of ours.
        this._ownHold = null;
        this._holdBusy = false;
        this._models = [];
        this._slowdown = 0;
        if (this.present)
            this._refreshModels();
        this._changed();
    }

    // ListModels, then each model object's properties (GetAll), asynchronously; a newer refresh wins.
    refreshModels() {
        this._refreshModels();
    }

    _refreshModels() {
        if (!this.present)
            return;
        const serial = ++this._modelsSerial;
        this._proxy.call('ListModels', null, Gio.DBusCallFlags.NO_AUTO_START, -1, this._cancellable, (p, res) => {
            let list;
            try {
                [list] = p.call_finish(res).recursiveUnpack();
            } catch (e) {
                // Cancelled (destroy()), or tandemd left meanwhile (the owner change refreshes again): no news.
                if (!e.matches(Gio.IOErrorEnum, Gio.IOErrorEnum.CANCELLED) && this.present)
                    log(`tandem: ListModels: ${e.message}`);
                return;
            }
            if (serial !== this._modelsSerial)
                return;
            const models = list.map(m => ({
                name: m.name, default: !!m.default, fallback: m.fallback || '', placement: m.placement || '',
                dtype: m.dtype || '', template: m.template || '', path: m.path, replicas: [],
            }));
            let pending = models.length;
            const done = () => {
                if (serial !== this._modelsSerial || this._destroyed)
                    return;
                this._models = models;
                this._changed();
            };
            if (pending === 0) {
                done();
                return;
            }
            const bus = this._proxy.get_connection();
            for (const m of models) {
                bus.call(BUS_NAME, m.path, 'org.freedesktop.DBus.Properties', 'GetAll',
                    new GLib.Variant('(s)', [MODEL_IFACE]), new GLib.VariantType('(a{sv})'),
                    Gio.DBusCallFlags.NO_AUTO_START, -1, this._cancellable, (c, r) => {
                        try {
                            const [props] = c.call_finish(r).recursiveUnpack();
                            m.replicas = props.Replicas || [];
                        } catch (e) {
                            if (e.matches(Gio.IOErrorEnum, Gio.IOErrorEnum.CANCELLED))
                                return;
                            if (this.present)
                                log(`tandem: ${m.path}: ${e.message}`);
                        }
                        if (--pending === 0)
                            done();
                    });
            }
        });
    }

    // True when this session holds the GPU (or is asking for it) and no other app does: the degraded episode that
    // follows is the user's own doing (presentation.js, Notifier). DegradedModeChanged comes before HoldGpu's reply
    // and before the Holds property changes, so an unanswered HoldGpu counts.
    ownHoldOnly() {
        const mine = this._ownHold || (this._holdBusy && this._holdWanted);
        if (!mine || !this._proxy)
            return false;
        const holds = unpackProp(this._proxy, 'Holds') || [];
        return holds.every(h => h[0] === this._ownHold);
    }

    // The "Keep off the GPU" toggle. HoldGpu on the Shell's own system-bus connection: the hold lives as long as
    // the session (the connection closes when the Shell exits) unless released here. Resolves to the snapshot.
    setHold(wanted) {
        if (!this.present || this._holdBusy || wanted === !!this._ownHold)
            return Promise.resolve(this.snapshot());
        this._holdBusy = true;
        this._holdWanted = wanted;
        this._changed();
        const [method, args] = wanted
            ? ['HoldGpu', new GLib.Variant('(ss)', [this._holdReason, this._appId])]
            : ['ReleaseGpu', new GLib.Variant('(s)', [this._ownHold])];
        return new Promise(resolve => {
            this._proxy.call(method, args, Gio.DBusCallFlags.NO_AUTO_START, -1, this._cancellable, (p, res) => {
                try {
                    const [cookie] = p.call_finish(res).deepUnpack();
                    this._ownHold = wanted ? cookie : null;
                    this._holdError = null;
                } catch (e) {
                    if (e.matches(Gio.IOErrorEnum, Gio.IOErrorEnum.CANCELLED)) {
                        resolve(null);
                        return;
                    }
                    this._holdError = classifyError(e);
                    // An unknown cookie means the hold is gone already.
                    if (!wanted && this._holdError.kind !== 'not-authorized')
                        this._ownHold = null;
                }
                this._holdBusy = false;
                this._changed();
                resolve(this.snapshot());
            });
        });
    }
}
