// Shared pieces of the pages: messages, confirmation dialogs, form fields with
// the API's field errors next to them, and the panel that shows a new token once.

import {ApiError} from './api.js';
import {h, id, announce, replace} from './dom.js';

// errorBox shows a failed call as a message. An error that is not the API's is a
// bug in the page: it is shown too, and logged so that it is noticed.
export function errorBox(err, what) {
  if (!(err instanceof ApiError)) {
    console.error(err); // eslint-disable-line no-console
    return h('div', {class: 'message error', role: 'alert'},
      h('p', null, h('strong', null, what || 'Something went wrong in this page')),
      h('p', null, String(err && err.message ? err.message : err)));
  }
  const p = err.problem;
  return h('div', {class: 'message error', role: 'alert'},
    h('p', null, h('strong', null, what ? `${what}: ${p.title || 'error'}` : (p.title || 'Error')),
      err.status ? h('span', {class: 'muted'}, ` (HTTP ${err.status})`) : null),
    err.message && err.message !== p.title ? h('p', null, err.message) : null,
    err.fieldErrors.length ? h('ul', null, err.fieldErrors.map((fe) =>
      h('li', null, fe.field ? [h('code', null, fe.field), ': '] : null, fe.message))) : null);
}

// message is an informational, success or warning note.
export function message(kind, ...children) {
  return h('div', {class: ['message', kind], role: kind === 'error' ? 'alert' : null}, ...children);
}

// openDialog shows a modal dialog built from title and content, with buttons;
// it resolves with the value of the button pressed (false for Escape or Cancel).
// A button with a true value first awaits onSubmit, when given, and the dialog
// stays open while that returns false (e.g. the form in it has errors). Focus
// moves into the dialog and returns to where it was afterwards.
export function openDialog({title, content, buttons, onSubmit}) {
  return new Promise((resolve) => {
    const tid = id('dialog-title');
    const back = document.activeElement;
    const dlg = h('dialog', {class: 'dialog', 'aria-labelledby': tid});
    const close = (value) => {
      dlg.close();
      dlg.remove();
      if (back && typeof back.focus === 'function' && document.contains(back)) back.focus();
      resolve(value);
    };
    dlg.addEventListener('cancel', (ev) => {
      ev.preventDefault();
      close(false);
    });
    const press = async (b, btn) => {
      if (b.value && onSubmit) {
        btn.disabled = true;
        const ok = await onSubmit();
        btn.disabled = false;
        if (!ok) return;
      }
      close(b.value);
    };
    const row = h('div', {class: 'actions'});
    for (const b of buttons) {
      const btn = h('button', {type: 'button', class: ['button', b.kind], autofocus: b.autofocus}, b.label);
      btn.addEventListener('click', () => press(b, btn));
      row.append(btn);
    }
    // Enter in a text field of the dialog presses its confirming button (a form
    // of several fields and no submit button of its own would do nothing).
    dlg.addEventListener('keydown', (ev) => {
      const i = buttons.findIndex((b) => b.value);
      if (ev.key === 'Enter' && ev.target instanceof HTMLInputElement && i >= 0) {
        ev.preventDefault();
        row.children[i].click();
      }
    });
    replace(dlg, h('h2', {id: tid}, title), h('div', {class: 'dialog-body'}, content), row);
    document.body.append(dlg);
    dlg.showModal();
  });
}

// confirm asks before doing something that cannot be undone.
export function confirm({title, content, action, danger}) {
  return openDialog({
    title,
    content,
    buttons: [
      {label: 'Cancel', value: false, kind: 'secondary', autofocus: true},
      {label: action, value: true, kind: danger ? 'danger' : 'primary'},
    ],
  });
}

// field is a labelled form control. name is the API's field name ("name",
// "policy.daily_cap"): errors the API reports for it are shown here.
export function field({name, label, control, hint, wide}) {
  const cid = control.id || id('f');
  control.id = cid;
  control.dataset.focusId = `field:${name}`;
  const describedBy = [];
  let hintEl = null;
  if (hint) {
    hintEl = h('p', {class: 'hint', id: `${cid}-hint`}, hint);
    describedBy.push(hintEl.id);
  }
  if (describedBy.length) control.setAttribute('aria-describedby', describedBy.join(' '));
  return h('div', {class: ['field', wide && 'wide'], dataset: {field: name}},
    h('label', {for: cid}, label), control, hintEl);
}

// clearErrors removes the field errors shown on form.
export function clearErrors(form) {
  for (const el of form.querySelectorAll('.field-error, .error-summary')) el.remove();
  for (const el of form.querySelectorAll('.field.invalid')) {
    el.classList.remove('invalid');
    const control = el.querySelector('input, select, textarea');
    if (control) {
      control.removeAttribute('aria-invalid');
      const hint = el.querySelector('.hint');
      if (hint) control.setAttribute('aria-describedby', hint.id);
      else control.removeAttribute('aria-describedby');
    }
  }
}

// fieldFor finds the field an API field name belongs to: the name itself, then
// without indexes ("policy.operations[2]" → "policy.operations"), then its
// parents ("labels.team" → "labels").
function fieldFor(form, name) {
  const candidates = [name, name.replace(/\[\d+\]/g, '')];
  let parent = candidates[1];
  while (parent.includes('.')) {
    parent = parent.slice(0, parent.lastIndexOf('.'));
    candidates.push(parent);
  }
  for (const c of candidates) {
    const el = form.querySelector(`[data-field="${CSS.escape(c)}"]`);
    if (el) return el;
  }
  return null;
}

// showErrors puts err's field errors next to their fields, and a summary of the
// failure at the top of form that links to each field. The focus moves to the
// summary so that a keyboard or screen reader user hears what went wrong.
export function showErrors(form, err, what) {
  clearErrors(form);
  const items = [];
  const loose = [];
  const fes = err instanceof ApiError ? err.fieldErrors : [];
  for (const fe of fes) {
    const el = fieldFor(form, fe.field || '');
    if (!el) {
      loose.push(fe);
      continue;
    }
    const control = el.querySelector('input, select, textarea');
    const eid = id('err');
    el.classList.add('invalid');
    el.append(h('p', {class: 'field-error', id: eid}, fe.field !== el.dataset.field ? `${fe.field}: ${fe.message}` : fe.message));
    if (control) {
      control.setAttribute('aria-invalid', 'true');
      control.setAttribute('aria-describedby', [control.getAttribute('aria-describedby'), eid].filter(Boolean).join(' '));
    }
    items.push(h('li', null, h('a', {
      href: '#', onclick: (ev) => {
        ev.preventDefault();
        if (control) control.focus();
      },
    }, fe.field), `: ${fe.message}`));
  }
  for (const fe of loose) items.push(h('li', null, fe.field ? [h('code', null, fe.field), ': '] : null, fe.message));
  const summary = fes.length
    ? h('div', {class: 'message error error-summary', role: 'alert', tabindex: '-1'},
      h('p', null, h('strong', null, what), ` — ${fes.length === 1 ? 'one problem' : `${fes.length} problems`}:`),
      h('ul', null, items))
    : h('div', {class: 'error-summary', tabindex: '-1'}, errorBox(err, what));
  form.prepend(summary);
  summary.focus();
  announce(`${what}: ${err.message}`);
}

// tokenPanel shows a vault key's token once, with a copy button, the proxy's base
// URL and snippets to paste into a Stripe SDK or curl.
export function tokenPanel({key, title}) {
  const tokenId = id('token');
  const input = h('input', {id: tokenId, class: 'token', type: 'text', readOnly: true, value: key.token,
    spellcheck: 'false', autocomplete: 'off', 'aria-describedby': `${tokenId}-warn`});
  const status = h('span', {class: 'copy-status', role: 'status'});
  const copy = h('button', {type: 'button', class: 'button primary', onclick: async () => {
    try {
      await navigator.clipboard.writeText(key.token);
      status.textContent = 'Copied to the clipboard.';
    } catch {
      input.focus();
      input.select();
      status.textContent = 'Selected: press Ctrl+C (⌘C) to copy.';
    }
  }}, 'Copy token');
  const base = key.base_url || '';
  const cur = key.policy?.currency || 'usd';
  const goSnippet = `sc := stripe.NewClient(os.Getenv("KEYBRAKE_VAULT_KEY"), stripe.WithBackends(
	stripe.NewBackendsWithConfig(&stripe.BackendConfig{
		URL: stripe.String(${JSON.stringify(base)}),
	})))
ch, err := sc.V1Charges.Create(ctx, &stripe.ChargeCreateParams{
	Amount:   stripe.Int64(2500),
	Currency: stripe.String(${JSON.stringify(cur)}),
	Source:   &stripe.PaymentSourceSourceParams{Token: stripe.String("tok_visa")},
})`;
  const curlSnippet = `export KEYBRAKE_VAULT_KEY='${key.token}'
curl ${base}/v1/charges -u "$KEYBRAKE_VAULT_KEY:" \\
  -H 'Idempotency-Key: order-42' \\
  -d amount=2500 -d currency=${cur} -d source=tok_visa`;
  return h('section', {class: 'panel token-panel', 'aria-labelledby': `${tokenId}-title`},
    h('h2', {id: `${tokenId}-title`}, title),
    h('div', {class: 'message warn', id: `${tokenId}-warn`},
      h('p', null, h('strong', null, 'Copy this token now: it will not be shown again. '),
        'keybrake keeps only its hash. If it is lost, rotate the key to get a new one.')),
    h('div', {class: 'field wide'}, h('label', {for: tokenId}, `Vault key token for ${key.name}`),
      h('div', {class: 'copy-row'}, input, copy), status),
    h('dl', {class: 'facts'},
      h('dt', null, 'Base URL for Stripe SDKs'), h('dd', null, h('code', null, base || '—')),
      h('dt', null, 'Key id'), h('dd', null, h('code', null, key.id))),
    h('h3', null, 'stripe-go'),
    h('pre', {class: 'snippet'}, h('code', null, goSnippet)),
    h('h3', null, 'curl'),
    h('pre', {class: 'snippet'}, h('code', null, curlSnippet)));
}
