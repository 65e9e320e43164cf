// Preloaded into every Node process of a sandbox on the egress network
// (NODE_OPTIONS=--require /usr/local/lib/stockade/proxy.js, set only when a proxy is given).
// Node 18's fetch ignores HTTP(S)_PROXY, and the proxy is the sandbox's only way out: this
// makes undici's global dispatcher (which fetch uses) send every request for a host not in
// NO_PROXY through the proxy named in HTTPS_PROXY. Loopback names stay direct.
'use strict';

const proxy = process.env.HTTPS_PROXY || process.env.https_proxy;
if (proxy) {
  try {
    const { Agent, Dispatcher, ProxyAgent, setGlobalDispatcher } = require('undici');
    const skipped = (process.env.NO_PROXY || process.env.no_proxy || '')
      .split(',')
      .map((name) => name.trim().toLowerCase())
      .filter(Boolean);
    const direct = new Agent();
    const proxied = new ProxyAgent(proxy);
    const bypass = (origin) => {
      const host = new URL(origin).hostname.toLowerCase().replace(/^\[|\]$/g, '');
      return skipped.some((name) => host === name || (name.startsWith('.') && host.endsWith(name)));
    };
    class Chooser extends Dispatcher {
      dispatch(options, handler) {
        return (bypass(String(options.origin)) ? direct : proxied).dispatch(options, handler);
      }
      close(...args) {
        return Promise.all([direct.close(), proxied.close()]).then(() => args[0]?.());
      }
      destroy(...args) {
        return Promise.all([direct.destroy(), proxied.destroy()]).then(() => args[0]?.());
      }
    }
    setGlobalDispatcher(new Chooser());
  } catch (err) {
    process.emitWarning(`stockade: fetch does not use the egress proxy: ${err.message}`);
  }
}
