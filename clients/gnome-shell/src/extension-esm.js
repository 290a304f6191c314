// Entry point for GNOME Shell 45 and later (ES modules). build.sh installs it as extension.js next to the shared
// modules. Everything but the imports is in indicator.js; extension-legacy.js is the same for Shell 43/44.

import Clutter from 'gi://Clutter';
import Gio from 'gi://Gio';
import GLib from 'gi://GLib';
import GObject from 'gi://GObject';
import Shell from 'gi://Shell';
import St from 'gi://St';

import * as Main from 'resource:///org/gnome/shell/ui/main.js';
import * as QuickSettings from 'resource:///org/gnome/shell/ui/quickSettings.js';
import * as PopupMenu from 'resource:///org/gnome/shell/ui/popupMenu.js';
import * as Config from 'resource:///org/gnome/shell/misc/config.js';
import {Extension, gettext, ngettext} from 'resource:///org/gnome/shell/extensions/extension.js';

import * as TandemClient from './tandemClient.js';
import * as Presentation from './presentation.js';
import {createIndicator} from './indicator.js';

export default class TandemExtension extends Extension {
    enable() {
        this._ui = createIndicator({
            Gio, GLib, GObject, St, Clutter, Shell, Main, QuickSettings, PopupMenu,
            TandemClient, Presentation,
            gettext, ngettext,
            path: this.path,
            shellMajor: parseInt(Config.PACKAGE_VERSION.split('.')[0], 10),
        });
    }

    disable() {
        this._ui?.destroy();
        this._ui = null;
    }
}
