// Entry point for GNOME Shell 43 and 44 (the legacy `imports` loader). build.sh installs it as extension.js next
// to the shared modules (tandemClient.js, presentation.js, indicator.js, rewritten for `imports`). Everything but
// the imports is in indicator.js; extension-esm.js is the same for Shell 45+.
/* exported init */

const {Gio, GLib, GObject, St, Clutter, Shell} = imports.gi;
const Main = imports.ui.main;
const QuickSettings = imports.ui.quickSettings;
const PopupMenu = imports.ui.popupMenu;
const Config = imports.misc.config;
const ExtensionUtils = imports.misc.extensionUtils;
const Me = ExtensionUtils.getCurrentExtension();

class TandemExtension {
    enable() {
        const gettext = ExtensionUtils.gettext;
        const ngettext = ExtensionUtils.ngettext;
        this._ui = Me.imports.indicator.createIndicator({
            Gio, GLib, GObject, St, Clutter, Shell, Main, QuickSettings, PopupMenu,
            TandemClient: Me.imports.tandemClient,
            Presentation: Me.imports.presentation,
            gettext, ngettext,
            path: Me.path,
            shellMajor: parseInt(Config.PACKAGE_VERSION.split('.')[0], 10),
        });
    }

    disable() {
        this._ui?.destroy();
        this._ui = null;
    }
}

function init() {
    ExtensionUtils.initTranslations();
    return new TandemExtension();
}
