// Fetching the API: the page passes its own ?token= on (B_api.md, "Serving beyond 127.0.0.1").
const TOKEN = new URLSearchParams(location.search).get("token");

/** The URL of an API path, with the token if the page was opened with one. */
export function apiUrl(path, params = {}) {
  const url = new URL(path, location.href);
  for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== null) url.searchParams.set(k, v);
  if (TOKEN) url.searchParams.set("token", TOKEN);
  return url.toString();
}

/** GET an API path; throws an Error carrying the server's {"error": ...} message. */
export async function api(path, params = {}) {
  const r = await fetch(apiUrl(path, params));
  let body;
  try { body = await r.json(); } catch { body = {}; }
  if (!r.ok) throw new Error(body.error || `${path}: HTTP ${r.status}`);
  return body;
}

/** A run id as one URL path segment (ids contain slashes; the server accepts them quoted). */
export const q = (id) => encodeURIComponent(id);
