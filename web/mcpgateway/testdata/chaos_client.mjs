// The agent of the gateway's chaos test: the reference TypeScript MCP client
// (@modelcontextprotocol/sdk) calling send_email N times through URL with CONCURRENCY workers,
// each logical call with its own idempotency key, retrying it with the same key after a
// transport error, as an agent retries after a timeout or a dropped stream. ABORT_RATE of the
// attempts are aborted by the client itself after 1-15 ms.
//
//   node chaos_client.mjs URL N CONCURRENCY ABORT_RATE PREFIX
//
// Prints one JSON line: {"results": {"<key>": {"final", "replayed", "messageId", "attempts",
// "to"}}, "latencies_ms": [...] (attempts answered without an abort), "tools": tools/list}.
// final is "ok", "unknown" (a tool error with code outcome_uncertain) or "error:<what>".
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';

const [url, nArg, concArg, abortArg, prefix] = process.argv.slice(2);
const n = Number(nArg);
const abortRate = Number(abortArg);
const results = {};
const latencies = [];
let tools;
let next = 0;

async function connect() {
  const client = new Client({ name: 'chaos-agent', version: '1.0.0' });
  await client.connect(new StreamableHTTPClientTransport(new URL(url)));
  return client;
}

async function worker() {
  const client = await connect();
  tools = (await client.listTools()).tools;
  for (let i = next++; i < n; i = next++) {
    const key = `${prefix}-${i}`;
    const to = `${prefix}-user-${i}@example.com`;
    const r = { final: 'error:gave up', replayed: false, attempts: 0, to };
    for (let attempt = 0; attempt < 20; attempt++) {
      r.attempts++;
      const abort = Math.random() < abortRate;
      const signal = abort ? AbortSignal.timeout(1 + Math.floor(Math.random() * 15)) : undefined;
      const t0 = performance.now();
      let res;
      try {
        res = await client.callTool({ name: 'send_email', arguments: { to, subject: 'hello', idempotencyKey: key } },
          undefined, { signal, timeout: 60_000 });
      } catch (e) {
        r.lastError = String(e);
        continue; // an agent retries with the same key
      }
      if (!abort) latencies.push(performance.now() - t0);
      if (res.isError) {
        const code = res._meta?.['io.idemgate/error']?.code;
        if (code === 'request_in_progress') continue;
        r.final = code === 'outcome_uncertain' ? 'unknown' : `error:${code || JSON.stringify(res.content)}`;
        break;
      }
      r.final = 'ok';
      r.replayed = res._meta?.['io.idemgate/replayed'] === true;
      r.messageId = res.structuredContent?.messageId;
      break;
    }
    results[key] = r;
  }
  await client.close();
}

const conc = Number(concArg);
await Promise.all(Array.from({ length: conc }, () => worker()));
console.log(JSON.stringify({ results, latencies_ms: latencies, tools }));
