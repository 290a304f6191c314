// The Tandem indicator's widgets: a system indicator (the top-bar icon) with a quick settings toggle ("Keep off
// the GPU") whose menu shows what runs where, modelled on the built-in power-profiles indicator.
//
// Shared by both GNOME generations. The Shell's modules reach this file as arguments (the entry points import
// them their own way: extension-legacy.js with `imports`, extension-esm.js with `import`), so it has no imports;
// build.sh only removes `export` for Shell 43/44. Differences between Shell versions are feature-tested here.

let _classes = null;  // GObject classes are registered once per Shell process, not per enable()

// The memory bar's colours (stylesheet.css has the same for the bar itself).
const MEMORY_COLORS = {ours: '#3584e4', foreign: '#e66100', margin: '#f6d32d', free: '#9a9996'};

function defineClasses(d) {
    const {GObject, GLib, St, QuickSettings, PopupMenu} = d;

    // A horizontal bar of segments (ours, foreign, margin, free) in proportion to their fractions.
    const MemoryBar = GObject.registerClass(
    class TandemMemoryBar extends St.BoxLayout {
        _init() {
            super._init({style_class: 'tandem-memory-bar', x_expand: true});
            this._segments = new Map();
            for (const kind of ['ours', 'foreign', 'margin', 'free']) {
                const w = new St.Widget({style_class: `tandem-memory-${kind}`, y_expand: true});
                this._segments.set(kind, w);
                this.add_child(w);
            }
            this._fractions = {};
            this.connect('notify::width', () => this._layout());
        }

        setSegments(segments) {
            this._fractions = {};
            for (const s of segments)
                this._fractions[s.kind] = s.fraction;
            this._layout();
        }

        _layout() {
            const width = this.width;
            if (!(width > 0))
                return;
            let used = 0;
            const kinds = [...this._segments.keys()];
            kinds.forEach((kind, i) => {
                let w = Math.round(width * (this._fractions[kind] || 0));
                if (i === kinds.length - 1)
                    w = Math.max(0, Math.round(width) - used);
                used += w;
                this._segments.get(kind).set_width(w);
            });
        }
    });

    const TandemToggle = GObject.registerClass(
    class TandemToggle extends QuickSettings.QuickMenuToggle {
        _init(ctx) {
            const major = ctx.shellMajor;
            const titleProp = major >= 44 ? 'title' : 'label';
            super._init({[titleProp]: ctx.P.present(null).title, gicon: ctx.icon(ctx.P.Icons.absent)});
            this._ctx = ctx;
            this._titleProp = titleProp;
            this._hasSubtitle = major >= 44;
            this.accessible_name = ctx.P.present(null).title;

            this.connect('clicked', () => ctx.client.setHold(!this.checked));

            // The menu: a sentence about the state, the hold switch and who else holds the GPU, the memory bar,
            // the models, the queues, the breaker.
            this._headline = this._textItem('tandem-headline');
            this.menu.addMenuItem(this._headline);
            this._holdSwitch = new PopupMenu.PopupSwitchMenuItem(ctx.P.present(null).holdSwitch.label, false);
            this._holdSwitch.connect('toggled', (_item, state) => ctx.client.setHold(state));
            this.menu.addMenuItem(this._holdSwitch);
            this._holdNote = this._textItem('tandem-note');
            this.menu.addMenuItem(this._holdNote);
            this._holdsSection = new PopupMenu.PopupMenuSection();
            this.menu.addMenuItem(this._holdsSection);

            this.menu.addMenuItem(new PopupMenu.PopupSeparatorMenuItem());
            this._memoryItem = new PopupMenu.PopupBaseMenuItem({reactive: false, can_focus: false});
            const memBox = new St.BoxLayout({vertical: true, x_expand: true});
            this._memoryBar = new MemoryBar();
            this._memoryCaption = new St.Label({style_class: 'tandem-caption', x_expand: true});
            this._wrap(this._memoryCaption);
            memBox.add_child(this._memoryBar);
            memBox.add_child(this._memoryCaption);
            this._memoryItem.add_child(memBox);
            this.menu.addMenuItem(this._memoryItem);

            this._modelsSection = new PopupMenu.PopupMenuSection();
            this.menu.addMenuItem(this._modelsSection);
            this._queuesSection = new PopupMenu.PopupMenuSection();
            this.menu.addMenuItem(this._queuesSection);
            this._breaker = this._textItem('tandem-detail');
            this.menu.addMenuItem(this._breaker);

            // Model objects do not announce changes: re-read them when the menu opens (an event, not a poll).
            this._menuOpenId = this.menu.connect('open-state-changed', (_m, open) => {
                if (open)
                    ctx.client.refreshModels();
            });
        }

        _wrap(label) {
            label.clutter_text.line_wrap = true;
            label.clutter_text.ellipsize = 0;  // Pango.EllipsizeMode.NONE
        }

        _textItem(styleClass) {
            const item = new PopupMenu.PopupBaseMenuItem({reactive: false, can_focus: false});
            item._label = new St.Label({style_class: styleClass, x_expand: true});
            this._wrap(item._label);
            item.add_child(item._label);
            return item;
        }

        _fillSection(section, lines, styleClass) {
            const texts = lines.map(l => l.text);
            if (section._texts && section._texts.join('\n') === texts.join('\n'))
                return;
            section._texts = texts;
            section.removeAll();
            for (const text of texts) {
                const item = this._textItem(styleClass);
                item._label.text = text;
                section.addMenuItem(item);
            }
        }

        sync(v) {
            const ctx = this._ctx;
            this[this._titleProp] = this._hasSubtitle ? v.title : v.label43;
            if (this._hasSubtitle)
                this.subtitle = v.subtitle;
            this.gicon = ctx.icon(v.iconName);
            this.checked = v.checked;
            this.reactive = v.sensitive;
            this.menuEnabled = true;
            this.menu.setHeader(ctx.icon(v.iconName), v.title, v.subtitle);

            this._headline._label.text = v.headline;
            this._holdSwitch.visible = v.sensitive;
            this._holdSwitch.setToggleState(v.holdSwitch.checked);
            this._holdSwitch.setSensitive(v.holdSwitch.sensitive);
            this._holdNote._label.text = v.holdNote;
            this._holdNote.visible = !!v.holdNote;
            this._fillSection(this._holdsSection, v.holds, 'tandem-detail');

            this._memoryItem.visible = v.sensitive;
            if (v.memory) {
                this._memoryBar.visible = true;
                this._memoryBar.setSegments(v.memory.segments);
                // The caption with a colour key: a square in each segment's colour before its label.
                const esc = t => GLib.markup_escape_text(t, -1);
                const keys = v.memory.segments.map(sg => `<span foreground="${MEMORY_COLORS[sg.kind]}">■</span>` +
                    `\u00a0${esc(sg.label).replace(/ /g, '\u00a0')}`);
                this._memoryCaption.clutter_text.set_markup(`${esc(v.memory.title)}\n${keys[0]}   ${keys[1]}\n` +
                    `${keys[2]}   ${keys[3]}`);
            } else {
                this._memoryBar.visible = false;
                this._memoryCaption.text = v.memoryNote || '';
            }
            this._fillSection(this._modelsSection, v.models, 'tandem-detail');
            this._fillSection(this._queuesSection, v.queues, 'tandem-detail');
            this._breaker._label.text = v.breaker;
            this._breaker.visible = !!v.breaker;
        }

        destroy() {
            if (this._menuOpenId) {
                this.menu.disconnect(this._menuOpenId);
                this._menuOpenId = 0;
            }
            // Shell 43 adds the menu's actor to the quick settings overlay and never removes it: destroy it here.
            const menu = this.menu;
            this.menu = null;
            menu?.destroy();
            super.destroy();
        }
    });

    const TandemIndicator = GObject.registerClass(
    class TandemIndicator extends QuickSettings.SystemIndicator {
        _init(ctx) {
            super._init();
            this._ctx = ctx;
            this._icon = this._addIndicator();
            this._icon.visible = false;
            this.toggle = new TandemToggle(ctx);
            this.quickSettingsItems.push(this.toggle);
        }

        sync(v) {
            this._icon.gicon = this._ctx.icon(v.iconName);
            this._icon.visible = v.panelVisible;
            this.toggle.sync(v);
        }
    });

    return {TandemIndicator};
}

// Creates the indicator, adds it to the quick settings area and starts the D-Bus client. Returns an object whose
// destroy() undoes all of it. d: the Shell's modules and the extension's own (see the entry points).
export function createIndicator(d) {
    if (!_classes)
        _classes = defineClasses(d);
    const {Gio, GLib, Main, Shell, TandemClient, Presentation: P} = d;
    P.setGettext(d.gettext, d.ngettext);

    const icons = new Map();
    const icon = name => {
        if (!icons.has(name))
            icons.set(name, Gio.FileIcon.new(Gio.File.new_for_path(GLib.build_filenamev([d.path, 'icons', `${name}.svg`]))));
        return icons.get(name);
    };
    const appSystem = Shell ? Shell.AppSystem.get_default() : null;
    const appName = appId => {
        const app = appSystem && appId ? appSystem.lookup_app(`${appId}.desktop`) : null;
        return app ? app.get_name() : P.defaultAppName(appId);
    };

    const client = new TandemClient.TandemClient({
        extensionDir: d.path,
        appId: 'org.gnome.Shell',
        holdReason: d.gettext('Keep off the GPU (set in the top bar)'),
    });
    const ctx = {client, P, icon, shellMajor: d.shellMajor};
    const indicator = new _classes.TandemIndicator(ctx);

    const qs = Main.panel.statusArea.quickSettings;
    if (typeof qs.addExternalIndicator === 'function') {
        qs.addExternalIndicator(indicator);  // Shell 44+
    } else {
        qs._indicators.insert_child_at_index(indicator, 0);  // Shell 43
        qs._addItems(indicator.quickSettingsItems);
    }

    let lastView = null;
    const sync = snap => {
        lastView = P.present(snap, appName);
        // The extension stays enabled on the lock screen (metadata.json: a hold must survive locking), where the
        // quick settings are reachable: nobody changes the hold from there.
        if (Main.sessionMode.isLocked) {
            lastView.sensitive = false;
            lastView.holdSwitch = {...lastView.holdSwitch, sensitive: false};
        }
        indicator.sync(lastView);
    };
    const sessionId = Main.sessionMode.connect('updated', () => sync(client.snapshot()));
    const notifier = new P.Notifier();
    let notification = null;
    const changedId = client.connect('changed', snap => {
        if (!snap.present)
            notifier.reset();
        sync(snap);
    });
    const degradedId = client.connect('degraded-mode-changed', signal => {
        const n = notifier.signal(signal, {ownHoldOnly: client.ownHoldOnly()});
        if (n) {
            notification = n;
            Main.notify(n.title, n.body);
        }
    });
    sync(client.snapshot());
    client.start().catch(e => logError(e, 'tandem: cannot create the D-Bus proxy'));

    return {
        indicator,
        client,
        // For tests (org.gnome.Shell.Eval): what the indicator shows now, and the last notification.
        get view() {
            return lastView;
        },
        get lastNotification() {
            return notification;
        },
        destroy() {
            Main.sessionMode.disconnect(sessionId);
            client.disconnect(changedId);
            client.disconnect(degradedId);
            client.destroy();
            for (const item of indicator.quickSettingsItems)
                item.destroy();
            indicator.quickSettingsItems = [];
            indicator.destroy();
            icons.clear();
        },
    };
}
