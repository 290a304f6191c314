// The Tandem indicator's presentation: what the panel icon, the quick settings toggle, its menu and the
// notifications say for a snapshot of tandemd's state (tandemClient.js). Pure functions of plain data, no Shell
// and no D-Bus, so plain gjs tests the very texts the indicator shows (tests/gnome-shell/).
//
// Shared by both GNOME generations: this is the ES-module form (Shell 45+); build.sh rewrites it for the legacy
// `imports` loader of Shell 43/44 (only `export` is removed). Keep it free of imports.
//
// Every user-visible string goes through _() / ngettext(), set by setGettext() (the extension passes its
// domain's functions; tests keep the identity).

let _ = s => s;
let ngettext = (s, p, n) => (n === 1 ? s : p);

export function setGettext(gettext, ngettextFn) {
    _ = gettext;
    ngettext = ngettextFn;
}

// Icon tokens: the extension maps each to icons/<token>.svg (symbolic, recoloured by the theme).
export const Icons = {
    normal: 'tandem-normal-symbolic',
    pressure: 'tandem-pressure-symbolic',
    degraded: 'tandem-degraded-symbolic',
    unavailable: 'tandem-unavailable-symbolic',
    absent: 'tandem-absent-symbolic',
};

const GiB = 1024 * 1024 * 1024;
const MiB = 1024 * 1024;

export function formatBytes(n) {
    n = Math.max(0, Number(n) || 0);
    if (n >= 10 * GiB)
        return _('%s GiB').replace('%s', (n / GiB).toFixed(0));
    if (n >= GiB)
        return _('%s GiB').replace('%s', (n / GiB).toFixed(1));
    if (n >= MiB)
        return _('%s MiB').replace('%s', (n / MiB).toFixed(0));
    return _('%s KiB').replace('%s', (n / 1024).toFixed(0));
}

export function formatDuration(ms) {
    const s = Math.round((Number(ms) || 0) / 1000);
    if (s < 60)
        return ngettext('%d second', '%d seconds', s).replace('%d', String(s));
    const m = Math.round(s / 60);
    if (m < 60)
        return ngettext('%d minute', '%d minutes', m).replace('%d', String(m));
    const h = Math.round(m / 60);
    return ngettext('%d hour', '%d hours', h).replace('%d', String(h));
}

// "2.1× slower", or "slower" while tandemd has not measured both routes yet (expected_slowdown 0 or 1).
export function formatSlowdown(slowdown) {
    if (!(slowdown > 1.05))
        return _('slower');
    const x = slowdown >= 10 ? slowdown.toFixed(0) : slowdown.toFixed(1);
    return _('about %s× slower').replace('%s', x);
}

// DegradedReason tokens (docs/dbus.md) in words. Unknown tokens (a newer tandemd) are shown as they are.
export function reasonText(reason) {
    switch (reason) {
    case 'gpu-absent': return _('the GPU is not available');
    case 'gpu-breaker-open': return _('the GPU failed recently and is paused');
    case 'gpu-breaker-half-open': return _('the GPU is being tested again');
    case 'gpu-held': return _('an app asked to keep the GPU free');
    case 'gpu-given-back': return _('another program needs the GPU memory');
    case 'memory-reading-stale': return _('GPU memory readings are late');
    case 'memory-critical': return _('GPU memory is almost full');
    case 'memory-pressure': return _('GPU memory is getting full');
    case 'fallback-model': return _('a smaller stand-in model is answering');
    case '': return '';
    default: return reason;
    }
}

function capitalize(s) {
    return s ? s[0].toUpperCase() + s.slice(1) : s;
}

// A desktop app id ("com.valvesoftware.Steam") as a name: the caller may resolve installed apps (Shell's
// AppSystem); otherwise the last element of a reverse-DNS id.
export function defaultAppName(appId) {
    if (!appId)
        return _('an unnamed app');
    const parts = appId.replace(/\.desktop$/, '').split('.');
    return parts.length > 1 ? parts[parts.length - 1] : appId;
}

// The memory bar: four segments in the order drawn (ours, foreign, margin, free), fractions of the total that add
// up to 1, and a caption. null when there is no device reading.
export function memoryBar(memory) {
    if (!memory || !memory.present || !(memory.total > 0))
        return null;
    const total = memory.total;
    const ours = Math.min(total, Math.max(0, memory.observed_used || 0));
    const foreign = Math.min(total - ours, Math.max(0, memory.foreign || 0));
    const driverFree = Math.max(0, total - ours - foreign);
    const margin = Math.min(driverFree, Math.max(0, memory.margin || 0));
    const free = driverFree - margin;
    const seg = (kind, bytes, label) => ({kind, bytes, fraction: bytes / total, label});
    const segments = [
        seg('ours', ours, _('Tandem %s').replace('%s', formatBytes(ours))),
        seg('foreign', foreign, _('other apps %s').replace('%s', formatBytes(foreign))),
        seg('margin', margin, _('kept free %s').replace('%s', formatBytes(margin))),
        seg('free', free, _('free %s').replace('%s', formatBytes(free))),
    ];
    const title = _('GPU memory (%s)').replace('%s', formatBytes(total));
    const caption = `${title}: ${segments.map(s => s.label).join(' · ')}`;
    return {segments, title, caption};
}

// Why a GPU copy was given back (docs/residency.md): to whom, when a hold did it.
function givenBackText(r, holders) {
    if (r.reason === 'hold')
        return holders.length ? _('GPU copy given back to %s').replace('%s', holders.join(', '))
            : _('GPU copy given back while the GPU is held');
    if (r.reason === 'pressure')
        return _('GPU copy given back to other apps');
    if (r.reason === 'idle')
        return _('GPU copy unloaded while idle');
    return _('GPU copy unloaded on request');
}

function replicaText(r, gpuLayers, holders = []) {
    const lost = r.state === 'lost';
    const loading = r.state === 'loading';
    const unloaded = r.state === 'unloaded';
    if ((r.device === 'gpu' || r.device === 'hybrid') && r.state === 'evicted')
        return givenBackText(r, holders);
    if ((r.device === 'gpu' || r.device === 'hybrid') && r.state === 'draining')
        return _('GPU copy being given back (running jobs finish first)');
    if (r.device === 'gpu') {
        if (lost) return _('GPU copy lost');
        if (loading) return _('GPU copy loading');
        if (unloaded) return _('GPU copy not loaded');
        return ngettext('GPU: %d layer', 'GPU: all %d layers', r.layers).replace('%d', String(r.layers));
    }
    if (r.device === 'hybrid') {
        if (lost) return _('GPU/CPU split lost');
        if (loading || unloaded) return _('GPU/CPU split not loaded');
        return _('split: %d of %t layers on the GPU, the rest on the CPU')
            .replace('%d', String(r.layers)).replace('%t', String(gpuLayers || '?'));
    }
    if (r.device === 'cpu') {
        if (loading) return _('CPU copy loading');
        if (unloaded || lost) return _('no CPU copy loaded');
        return r.mode === 'warm' ? _('CPU copy ready') : _('CPU copy read from disk when needed');
    }
    return `${r.device} (${r.state})`;
}

// One line per configured model: its name, its kind (the default model, a fallback of another, or an extra
// one), and where it runs.
export function modelLines(models, holders = []) {
    if (!models || models.length === 0)
        return [];
    const fallbackOf = new Map();
    for (const m of models) {
        if (m.fallback)
            fallbackOf.set(m.fallback, m.name);
    }
    return models.map(m => {
        let kind;
        if (m.default)
            kind = _('default model');
        else if (fallbackOf.has(m.name))
            kind = _('stand-in for %s').replace('%s', fallbackOf.get(m.name));
        else
            kind = _('model');
        const replicas = m.replicas || [];
        const gpu = replicas.find(r => r.device === 'gpu');
        const where = replicas.length
            ? replicas.map(r => replicaText(r, gpu ? gpu.layers : 0, holders)).join(' · ')
            : m.placement || _('not loaded');
        return {name: m.name, text: `${m.name} (${kind}): ${where}`};
    });
}

export function queueLines(queues) {
    return (queues || []).map(q => {
        const name = q.name === 'gpu' ? _('GPU queue') : q.name === 'cpu' ? _('CPU queue')
            : _('%s queue').replace('%s', q.name);
        if (q.depth === 0 && q.running === 0)
            return {name: q.name, text: _('%s: idle').replace('%s', name)};
        let text = `${name}: ` +
            ngettext('%d running', '%d running', q.running).replace('%d', String(q.running)) + ', ' +
            ngettext('%d waiting', '%d waiting', q.depth).replace('%d', String(q.depth));
        if (q.depth > 0 && q.oldest_age_ms >= 1000)
            text += ' ' + _('(the oldest for %s)').replace('%s', formatDuration(q.oldest_age_ms));
        return {name: q.name, text};
    });
}

export function breakerLine(breaker) {
    switch (breaker) {
    case 'closed': return _('GPU health: good');
    case 'open': return _('GPU health: it failed recently; Tandem tries it again shortly');
    case 'half_open': return _('GPU health: being tested again');
    case undefined: case null: case '': return '';
    default: return _('GPU health: %s').replace('%s', breaker);
    }
}

export function holdLines(holds, ownCookie, appName = defaultAppName) {
    return (holds || []).map(h => {
        if (h.cookie === ownCookie)
            return {cookie: h.cookie, own: true, text: _('Kept off the GPU by you (this session)')};
        const who = appName(h.app_id);
        const text = h.reason
            ? _('Held by %s: %r').replace('%s', who).replace('%r', h.reason)
            : _('Held by %s').replace('%s', who);
        return {cookie: h.cookie, own: false, text};
    });
}

// The whole indicator for one snapshot (tandemClient.js, TandemClient.snapshot()):
//   panelVisible, iconName   the top-bar icon (hidden while tandemd is not on the bus)
//   title, subtitle          the quick settings toggle (Shell 44+ shows the subtitle under the title) and the
//                            menu's header; label43: the toggle's only text on Shell 43 (no subtitle there)
//   checked, sensitive       the toggle: checked = this session keeps Tandem off the GPU
//   headline                 the menu's first line: the state in a sentence
//   memory, models, queues, breaker, holds, holdSwitch, holdNote   the menu's contents
export function present(snap, appName = defaultAppName) {
    const v = {
        panelVisible: false,
        iconName: Icons.absent,
        title: _('Tandem'),
        subtitle: '',
        label43: '',
        checked: false,
        sensitive: false,
        headline: '',
        memory: null,
        models: [],
        queues: [],
        breaker: '',
        holds: [],
        holdSwitch: {label: _('Keep off the GPU'), checked: false, sensitive: false},
        holdNote: '',
        state: 'absent',
    };
    if (!snap || !snap.present) {
        v.subtitle = _('Not running');
        v.label43 = _('Tandem off');
        v.headline = _('Tandem is not running: no local AI service is available.');
        return v;
    }
    const state = snap.state || 'normal';
    const reason = snap.degradedReason || '';
    const why = reasonText(reason);
    v.state = state;
    v.panelVisible = true;
    v.sensitive = true;
    switch (state) {
    case 'normal':
        v.iconName = Icons.normal;
        v.subtitle = _('On the GPU');
        v.headline = _('Running on the GPU at full speed.');
        break;
    case 'pressure':
        v.iconName = Icons.pressure;
        v.subtitle = _('GPU memory tight');
        v.headline = capitalize(why || _('GPU memory is tight')) + '. ' +
            _('New work may wait, or run on the CPU.');
        break;
    case 'degraded':
        v.iconName = Icons.degraded;
        v.subtitle = _('On the CPU, %s').replace('%s', formatSlowdown(snap.slowdown));
        v.headline = _('Running on the CPU, %s, because %r.')
            .replace('%s', formatSlowdown(snap.slowdown)).replace('%r', why || _('the GPU cannot be used'));
        break;
    case 'unavailable':
        v.iconName = Icons.unavailable;
        v.subtitle = _('Not serving');
        v.headline = _('Not serving: %r, and there is no CPU copy to fall back to.')
            .replace('%r', why || _('the GPU cannot be used'));
        break;
    default:
        v.iconName = Icons.pressure;
        v.subtitle = state;
        v.headline = why ? `${state}: ${why}` : state;
    }
    // Shell 43's toggles have room for about ten characters and no subtitle: the state in a word or two.
    v.label43 = state === 'normal' ? _('Tandem') : state === 'degraded' ? _('On the CPU')
        : state === 'pressure' ? _('GPU tight') : state === 'unavailable' ? _('Not serving') : _('Tandem');

    v.memory = memoryBar(snap.memory);
    if (!v.memory)
        v.memoryNote = _('No GPU memory reading: the GPU is not available.');
    v.models = modelLines(snap.models, (snap.holds || []).filter(h => h.cookie !== snap.ownHold)
        .map(h => appName(h.app_id)).concat(snap.ownHold ? [_('you')] : []));
    v.queues = queueLines(snap.queues);
    v.breaker = breakerLine(snap.breaker);
    v.holds = holdLines(snap.holds, snap.ownHold, appName);

    const own = !!snap.ownHold;
    v.checked = own;
    v.holdSwitch = {label: _('Keep off the GPU'), checked: own, sensitive: !snap.holdBusy};
    if (own) {
        v.subtitle = _('Kept off the GPU');
        v.label43 = _('Off the GPU');
    }
    if (snap.holdError) {
        const e = snap.holdError;
        if (e.kind === 'not-authorized') {
            v.holdNote = e.group
                ? _('Only members of the group “%g” may keep Tandem off the GPU. An administrator can add you: ' +
                    'sudo adduser %u %g (then log out and in again).').replace(/%g/g, e.group)
                    .replace('%u', snap.userName || '$USER')
                : _('You may not keep Tandem off the GPU: %s').replace('%s', e.message);
            if (!own)
                v.subtitle = _('Needs group %g').replace('%g', e.group || 'tandem-admin');
        } else {
            v.holdNote = _('Could not change the GPU hold: %s').replace('%s', e.message);
        }
    }
    return v;
}

// Desktop notifications for DegradedModeChanged. One when Tandem leaves the GPU (degraded or unavailable), one
// when it is back, one when it goes from degraded to unavailable or back; none for pressure, for a change of
// reason within the same level, or for a signal that repeats the current level. An episode that this session
// started itself (its own "Keep off the GPU" hold, and no other app's) is silent, its end too. When tandemd
// leaves the bus, reset(): the indicator shows "Not running" instead, and a daemon that comes back normal is not
// announced.
export class Notifier {
    constructor() {
        this.level = 'normal';
        this.silent = false;
    }

    reset() {
        this.level = 'normal';
        this.silent = false;
    }

    // signal: {degraded, reason, details} as DegradedModeChanged carries it. ownHoldOnly: this session holds (or
    // is asking for) the GPU hold, and no other app does. Returns {title, body} or null.
    signal(signal, {ownHoldOnly = false} = {}) {
        const details = signal.details || {};
        const level = details.level || (signal.degraded ? 'degraded' : 'normal');
        const bad = l => l === 'degraded' || l === 'unavailable';
        const prev = this.level;
        const why = capitalize(reasonText(signal.reason || '') || _('the GPU cannot be used'));
        let notification = null;
        if (bad(level) && level !== prev) {
            if (!bad(prev))
                this.silent = ownHoldOnly && signal.reason === 'gpu-held';
            if (level === 'degraded') {
                notification = {
                    title: _('Tandem is running on the CPU'),
                    body: _('%r: AI answers come %s until the GPU is back.')
                        .replace('%r', why).replace('%s', formatSlowdown(details.expected_slowdown)),
                };
            } else {
                notification = {
                    title: _('Tandem has stopped answering'),
                    body: _('%r, and there is no CPU copy to fall back to.').replace('%r', why),
                };
            }
        } else if (!bad(level) && bad(prev)) {
            notification = {
                title: _('Tandem is back on the GPU'),
                body: _('AI answers are at full speed again.'),
            };
        }
        this.level = level;
        if (this.silent) {
            if (!bad(level))
                this.silent = false;
            return null;
        }
        return notification;
    }
}
