// desktop-sandbox: default preferences of the guest browser (installed into
// /usr/lib/firefox-esr/defaults/pref/). The enterprise policies in
// policies.json fix and lock the proxy and DNS settings; these only stop
// background requests to Mozilla services, which the default-deny gateway
// would refuse anyway and which would otherwise fill the decision log.
pref("dom.push.enabled", false);
pref("dom.push.connection.enabled", false);
pref("geo.enabled", false);
pref("geo.provider.network.url", "");
pref("browser.region.network.url", "");
pref("browser.region.update.enabled", false);
pref("extensions.update.enabled", false);
pref("extensions.getAddons.cache.enabled", false);
pref("extensions.systemAddon.update.enabled", false);
pref("media.gmp-manager.updateEnabled", false);
pref("media.gmp-gmpopenh264.enabled", false);
pref("captivedetect.canonicalURL", "");
pref("browser.ping-centre.telemetry", false);
pref("browser.newtabpage.activity-stream.feeds.telemetry", false);
pref("browser.newtabpage.activity-stream.telemetry", false);
pref("browser.topsites.contile.enabled", false);
pref("browser.urlbar.quicksuggest.enabled", false);
// OCSP is fail-open and would be refused by the gateway: skip the round trip.
pref("security.OCSP.enabled", 0);
