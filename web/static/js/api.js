// The admin API client: every request carries the session's token as a Bearer
// header; errors come back as ApiError with the problem+json body. A 401 ends the
// session (the token expired or was refused), which sends the user to sign in.

import {session} from './session.js';

// ApiError is a failed API call: status (0 when the server did not answer) and
// the RFC 9457 problem it answered with.
export class ApiError extends Error {
  constructor(status, problem) {
    super(problem?.detail || problem?.title || `HTTP ${status}`);
    this.status = status;
    this.problem = problem || {};
  }

  // fieldErrors lists the problem's [{field, message}].
  get fieldErrors() {
    return Array.isArray(this.problem.errors) ? this.problem.errors : [];
  }
}

// request calls the admin API: method, a path under /api/v1, and an optional JSON
// body. opts.token overrides the session's token (to check one before keeping
// it); opts.contentType overrides application/json.
export async function request(method, path, body, opts = {}) {
  const token = opts.token || session.token();
  if (!token) throw new ApiError(401, {title: 'Unauthorized', detail: 'You are not signed in.'});
  const headers = {Authorization: `Bearer ${token}`, Accept: 'application/json'};
  let payload;
  if (body !== undefined) {
    headers['Content-Type'] = opts.contentType || 'application/json';
    payload = JSON.stringify(body);
  }
  let resp;
  try {
    resp = await fetch(`/api/v1${path}`, {
      method, headers, body: payload, cache: 'no-store', credentials: 'omit', redirect: 'error',
    });
  } catch (err) {
    throw new ApiError(0, {title: 'keybrake did not answer', detail: `The request failed: ${err.message}. Is keybrake running?`});
  }
  const text = await resp.text();
  let data = null;
  if (text) {
    try {
      data = JSON.parse(text);
    } catch {
      data = {title: resp.statusText, detail: text.slice(0, 200)};
    }
  }
  if (!resp.ok) {
    const err = new ApiError(resp.status, data || {title: resp.statusText || `HTTP ${resp.status}`});
    if (resp.status === 401 && !opts.token) {
      session.end(`You were signed out: ${err.message}. Sign in again.`);
    }
    throw err;
  }
  return data;
}

export const get = (path, opts) => request('GET', path, undefined, opts);
export const post = (path, body) => request('POST', path, body);

// query builds "?a=1&b=2" from an object, leaving out empty values.
export function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    for (const one of Array.isArray(v) ? v : [v]) {
      if (one !== undefined && one !== null && one !== '') q.append(k, one);
    }
  }
  const s = q.toString();
  return s ? `?${s}` : '';
}

// pathId escapes an id for a path segment.
export const pathId = (id) => encodeURIComponent(id);
