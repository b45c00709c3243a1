// Sign in by pasting an admin or viewer token (a JWT from `keybrake token`, or
// the first-start token `keybrake serve` prints).

import {get, ApiError} from '../api.js';
import {session, claimsOf} from '../session.js';
import {h, id} from '../dom.js';
import {field, showErrors, clearErrors, message} from '../ui.js';

export function mount(main) {
  const notice = session.takeNotice();
  const tokenInput = h('textarea', {name: 'token', rows: 4, required: true, spellcheck: 'false',
    autocomplete: 'off', autocapitalize: 'off', class: 'mono', placeholder: 'eyJhbGciOiJIUzI1NiIs…'});
  const submit = h('button', {type: 'submit', class: 'button primary'}, 'Sign in');
  const form = h('form', {class: 'form signin-form', method: 'post', novalidate: true},
    field({name: 'token', label: 'Admin or viewer token', control: tokenInput, wide: true,
      hint: 'A JWT for the admin API. It is kept in this browser tab only and sent with each request.'}),
    h('div', {class: 'actions'}, submit));
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    clearErrors(form);
    const token = tokenInput.value.trim();
    const fail = (detail) => showErrors(form,
      new ApiError(0, {title: 'Cannot sign in', detail, errors: [{field: 'token', message: detail}]}), 'Cannot sign in');
    if (!token) return fail('Paste a token first.');
    const claims = claimsOf(token);
    if (!claims) return fail('This is not a JWT: a token has three parts separated by dots.');
    if (typeof claims.exp === 'number' && claims.exp * 1000 <= Date.now()) {
      return fail(`This token expired at ${new Date(claims.exp * 1000).toISOString()}. Mint a new one.`);
    }
    submit.disabled = true;
    try {
      await get('/overview', {token});
      session.start(token);
    } catch (err) {
      submit.disabled = false;
      fail(err.status === 401 ? `The token was refused: ${err.message}` : `keybrake could not check the token: ${err.message}`);
    }
  });
  const hid = id('signin');
  main.append(h('div', {class: 'signin'},
    h('h1', {id: hid}, 'Sign in to keybrake'),
    notice ? message('info', h('p', null, notice)) : null,
    form,
    h('div', {class: 'help'},
      h('h2', null, 'Where to get a token'),
      h('p', null, 'On the machine where keybrake runs, from its working directory:'),
      h('pre', {class: 'snippet'}, h('code', null, 'keybrake token --link          # a sign-in link for this page\nkeybrake token --role admin     # or --role viewer, read-only\nkeybrake token --role admin --ttl 8h --sub alice@example.com')),
      h('p', null, 'On its first start, ', h('code', null, 'keybrake serve'),
        ' prints a sign-in link that opens this page already signed in. A token is valid until it expires; then this page asks for a new one.'))));
  tokenInput.focus({preventScroll: true});
  return {};
}
