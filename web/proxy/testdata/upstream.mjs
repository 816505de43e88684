// A small upstream service for the proxy's tests, in Node.js with its standard library only:
// it counts its side effects per Idempotency-Key, so a test can prove each happened at most once.
//
//   node upstream.mjs            listens on 127.0.0.1 on a free port and prints it on stdout
//
//   POST|PATCH /charges/...  one side effect: effects[key] += 1, then after 0-20 ms answers
//                            201 {"key", "effect": n, "charge": "ch_<random>", "fencing",
//                            "previous", "previous_state"} (the last three from the
//                            proxy's Idempotency-* request headers). With
//                            ?early=1 it sends a 103 Early Hints first; with ?halfway=1
//                            it sends the headers and part of the body, then cuts the
//                            connection; with ?drop=1 or the header X-Drop: 1 it counts the effect and then destroys the connection
//                            without answering (an answer lost after the effect). With
//                            ?status=N it answers N instead, after counting.
//   POST /orders             the conformance suite's service (e2e/conformance/README.md)
//   POST /refuse             answers 503 without counting anything (a service shedding load)
//   GET  /effects            {"<key>": n, ...}
//   GET  /echo               200 with the request's method, url and headers (pass-through)
//   GET  /stream             200 text/plain "first\n" at once, then "last\n" and the end only
//                            once GET /stream/release is called (a long answer, streamed)
//   POST /count              {"bytes": n, "sha256": hex, "chunked": bool} of the request
//                            body, read as it arrives, never held whole (a large upload)
import http from 'node:http';
import crypto from 'node:crypto';

const effects = new Map();
let ordersStarted = 0;
const streams = [];

const server = http.createServer((req, res) => {
  const url = new URL(req.url, 'http://upstream');
  if (req.method === 'GET' && url.pathname === '/stream') {
    res.writeHead(200, { 'content-type': 'text/plain' });
    res.write('first\n');
    streams.push(res);
    return;
  }
  if (req.method === 'GET' && url.pathname === '/stream/release') {
    for (const s of streams.splice(0)) s.end('last\n');
    res.writeHead(204);
    res.end();
    return;
  }
  if (req.method === 'POST' && url.pathname === '/count') {
    const hash = crypto.createHash('sha256');
    let bytes = 0;
    req.on('data', (chunk) => { bytes += chunk.length; hash.update(chunk); });
    req.on('end', () => {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ bytes, sha256: hash.digest('hex'), chunked: req.headers['transfer-encoding'] === 'chunked' }));
    });
    return;
  }
  let body = '';
  req.on('data', (chunk) => { body += chunk; });
  req.on('end', () => {
    if (req.method === 'GET' && url.pathname === '/effects') {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify(Object.fromEntries(effects)));
      return;
    }
    if (req.method === 'GET' && url.pathname === '/echo') {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ method: req.method, url: req.url, headers: req.headers }));
      return;
    }
    // The service the conformance suite (e2e/conformance) expects: POST /orders answers 201
    // with an id unique per execution, after ?delay_ms, or ?status instead of 201;
    // GET /orders/started counts the executions begun.
    if (req.method === 'GET' && url.pathname === '/orders/started') {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(String(ordersStarted));
      return;
    }
    if (req.method === 'POST' && url.pathname === '/orders') {
      ordersStarted += 1;
      const status = Number(url.searchParams.get('status') || 201);
      setTimeout(() => {
        res.writeHead(status, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ id: crypto.randomUUID() }));
      }, Number(url.searchParams.get('delay_ms') || 0));
      return;
    }
    if (url.pathname === '/refuse') {
      res.writeHead(503, { 'content-type': 'application/json', 'retry-after': '1' });
      res.end('{"error":"busy, nothing done"}');
      return;
    }
    if ((req.method === 'POST' || req.method === 'PATCH') && url.pathname.startsWith('/charges')) {
      const key = req.headers['idempotency-key'] || '(none)';
      const n = (effects.get(key) || 0) + 1;
      effects.set(key, n);
      if (url.searchParams.get('early') === '1') {
        res.writeEarlyHints({ link: '</style.css>; rel=preload; as=style' }); // a 103 before the answer
      }
      if (url.searchParams.get('halfway') === '1') {
        // Headers and part of the body, then the connection is cut: an answer lost midway.
        res.writeHead(201, { 'content-type': 'application/json', 'set-cookie': 'session=upstream' });
        res.write('{"partial":');
        setTimeout(() => req.socket.destroy(), 10);
        return;
      }
      if (url.searchParams.get('drop') === '1' || req.headers['x-drop'] === '1') {
        req.socket.destroy();
        return;
      }
      const status = Number(url.searchParams.get('status') || 201);
      setTimeout(() => {
        res.writeHead(status, { 'content-type': 'application/json', 'x-charge-version': '1' });
        res.end(JSON.stringify({ key, effect: n, charge: 'ch_' + crypto.randomBytes(8).toString('hex'), body,
          fencing: req.headers['idempotency-fencing-token'] || null,
          previous: req.headers['idempotency-previous-operation'] || null,
          previous_state: req.headers['idempotency-previous-state'] || null }));
      }, Math.floor(Math.random() * 20));
      return;
    }
    res.writeHead(404, { 'content-type': 'application/json' });
    res.end('{"error":"not found"}');
  });
});

server.keepAliveTimeout = 60_000;
server.listen(0, '127.0.0.1', () => {
  console.log(server.address().port);
});
