// The signed-in session: the admin API token (a JWT) lives in this tab's
// sessionStorage only — never in a cookie, never in a URL — and is sent as a
// Bearer header. Signing out, or the token expiring, forgets it.

const TOKEN_KEY = 'keybrake.token';
const NOTICE_KEY = 'keybrake.notice';

let expiryTimer = 0;
const listeners = new Set();

// claimsOf decodes a JWT's payload without verifying it (the server verifies;
// the page only reads the role, the subject and the expiry to show them). It
// returns null for anything that is not a JWT.
export function claimsOf(token) {
  const parts = (token || '').split('.');
  if (parts.length !== 3) return null;
  try {
    const b64 = parts[1].replace(/-/g, '+').replace(/_/g, '/');
    const json = atob(b64.padEnd(b64.length + ((4 - (b64.length % 4)) % 4), '='));
    const claims = JSON.parse(new TextDecoder().decode(Uint8Array.from(json, (c) => c.charCodeAt(0))));
    return claims && typeof claims === 'object' ? claims : null;
  } catch {
    return null;
  }
}

function notify() {
  for (const fn of listeners) fn();
}

function schedule() {
  clearTimeout(expiryTimer);
  const claims = session.claims();
  if (!claims || typeof claims.exp !== 'number') return;
  const ms = claims.exp * 1000 - Date.now();
  // setTimeout takes at most 2^31-1 ms; a token valid that long is re-checked then.
  expiryTimer = setTimeout(() => {
    if (session.claims() && session.claims().exp * 1000 <= Date.now()) {
      session.end('Your token has expired. Sign in again.');
    } else {
      schedule();
    }
  }, Math.min(Math.max(ms, 0), 2 ** 31 - 1));
}

export const session = {
  token() {
    return sessionStorage.getItem(TOKEN_KEY);
  },
  claims() {
    return claimsOf(this.token());
  },
  isAdmin() {
    return this.claims()?.role === 'admin';
  },
  // start keeps token for this tab.
  start(token) {
    sessionStorage.setItem(TOKEN_KEY, token);
    sessionStorage.removeItem(NOTICE_KEY);
    schedule();
    notify();
  },
  // end forgets the token; notice, if any, is shown on the sign-in page.
  end(notice) {
    sessionStorage.removeItem(TOKEN_KEY);
    if (notice) sessionStorage.setItem(NOTICE_KEY, notice);
    else sessionStorage.removeItem(NOTICE_KEY);
    clearTimeout(expiryTimer);
    notify();
  },
  // takeNotice returns and clears the message left by end.
  takeNotice() {
    const n = sessionStorage.getItem(NOTICE_KEY);
    sessionStorage.removeItem(NOTICE_KEY);
    return n;
  },
  onChange(fn) {
    listeners.add(fn);
  },
  resume() {
    schedule();
  },
};
