// An MCP server for the gateway's tests, written with the reference TypeScript SDK
// (@modelcontextprotocol/sdk), stateless over streamable HTTP. It counts its side effects, so
// a test can prove each happened at most once.
//
//   node upstream.mjs DROP_RATE MODE SEED   prints its port on stdout
//
//   POST /mcp      tools: send_email {to, subject} (writes: effects[to] += 1, answers
//                  {messageId, effect}), book {room, idempotencyKey} (writes, with a key
//                  argument of its own: effects[room] += 1), count_sent {to} (readOnlyHint). With DROP_RATE > 0 a
//                  share of send_email calls have their answer dropped after the effect: the
//                  connection is destroyed when the response is written. MODE is "sse" (answers
//                  as server-sent events, the SDK's default), "json", or "stateful" (sessions,
//                  SSE; needed by confirm_send {to}, which asks the client to confirm mid-call).
//   GET  /effects  {"effects": {"<to>": n}, "dropped": ["<to>", ...]}
import http from 'node:http';
import crypto from 'node:crypto';
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { ElicitResultSchema, isInitializeRequest } from '@modelcontextprotocol/sdk/types.js';
import { z } from 'zod';

const dropRate = Number(process.argv[2] || 0);
const json = process.argv[3] === 'json';
const stateful = process.argv[3] === 'stateful';
const sessions = new Map(); // stateful mode: session id -> transport
let seed = Number(process.argv[4] || 1);
const rand = () => { seed = (seed * 1103515245 + 12345) % 2147483648; return seed / 2147483648; };

const effects = new Map();
const dropped = [];

function newServer() {
  const server = new McpServer({ name: 'mail', version: '1.0.0' });
  server.registerTool('send_email', {
    description: 'Sends an e-mail.',
    inputSchema: { to: z.string(), subject: z.string() },
    outputSchema: { messageId: z.string(), effect: z.number() },
    annotations: { readOnlyHint: false, destructiveHint: false, idempotentHint: false, openWorldHint: true },
  }, async ({ to }) => {
    const n = (effects.get(to) || 0) + 1;
    effects.set(to, n);
    const out = { messageId: 'msg-' + crypto.randomUUID(), effect: n };
    return { content: [{ type: 'text', text: JSON.stringify(out) }], structuredContent: out };
  });
  server.registerTool('book', {
    description: 'Books a room; takes an idempotency key of its own.',
    inputSchema: { room: z.string(), idempotencyKey: z.string().optional() },
    annotations: { readOnlyHint: false },
  }, async ({ room, idempotencyKey }, extra) => {
    const n = (effects.get(room) || 0) + 1;
    effects.set(room, n);
    const meta = JSON.stringify(extra?._meta || {});
    return { content: [{ type: 'text', text: `booked ${room} (${n}) key=${idempotencyKey} meta=${meta}` }] };
  });
  server.registerTool('confirm_send', {
    description: 'Sends an e-mail once the user confirms (asks the client mid-call: elicitation).',
    inputSchema: { to: z.string() },
    annotations: { readOnlyHint: false },
  }, async ({ to }, extra) => {
    const answer = await extra.sendRequest({ method: 'elicitation/create', params: {
      message: `Send to ${to}?`,
      requestedSchema: { type: 'object', properties: { ok: { type: 'boolean' } }, required: ['ok'] },
    } }, ElicitResultSchema);
    if (answer.action !== 'accept') return { content: [{ type: 'text', text: 'declined' }], isError: true };
    effects.set(to, (effects.get(to) || 0) + 1);
    return { content: [{ type: 'text', text: `sent to ${to} after confirmation` }] };
  });
  server.registerTool('count_sent', {
    description: 'How many e-mails were sent to an address.',
    inputSchema: { to: z.string() },
    annotations: { readOnlyHint: true },
  }, async ({ to }) => ({ content: [{ type: 'text', text: String(effects.get(to) || 0) }] }));
  return server;
}

const httpServer = http.createServer(async (req, res) => {
  const url = new URL(req.url, 'http://upstream');
  if (url.pathname === '/effects') {
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ effects: Object.fromEntries(effects), dropped }));
    return;
  }
  if (stateful && url.pathname === '/mcp' && req.method !== 'POST') {
    const transport = sessions.get(req.headers['mcp-session-id']);
    if (!transport) { res.writeHead(404).end(); return; }
    await transport.handleRequest(req, res);
    return;
  }
  if (url.pathname !== '/mcp' || req.method !== 'POST') {
    res.writeHead(405, { 'content-type': 'application/json' });
    res.end('{"jsonrpc":"2.0","id":null,"error":{"code":-32000,"message":"Method not allowed."}}');
    return;
  }
  let body = '';
  for await (const chunk of req) body += chunk;
  let msg;
  try { msg = JSON.parse(body); } catch { msg = undefined; }
  if (dropRate > 0 && msg?.method === 'tools/call' && msg.params?.name === 'send_email' && rand() < dropRate) {
    // The answer is lost after the effect: the tool runs, and the connection is cut when the
    // SDK writes its response.
    dropped.push(msg.params.arguments?.to);
    const cut = () => { req.socket.destroy(); return true; };
    res.write = cut;
    res.end = cut;
    res.flushHeaders = () => {};
  }
  if (stateful) {
    // A session per client, so the server can ask the client something mid-call and get
    // the answer (a later POST of the same session).
    let transport = sessions.get(req.headers['mcp-session-id']);
    if (!transport && isInitializeRequest(msg)) {
      transport = new StreamableHTTPServerTransport({
        sessionIdGenerator: () => crypto.randomUUID(),
        onsessioninitialized: (id) => { sessions.set(id, transport); },
      });
      await newServer().connect(transport);
    }
    if (!transport) {
      res.writeHead(404, { 'content-type': 'application/json' });
      res.end('{"jsonrpc":"2.0","id":null,"error":{"code":-32001,"message":"Session not found"}}');
      return;
    }
    await transport.handleRequest(req, res, msg);
    return;
  }
  const server = newServer();
  const transport = new StreamableHTTPServerTransport({ sessionIdGenerator: undefined, enableJsonResponse: json });
  res.on('close', () => { transport.close(); server.close(); });
  await server.connect(transport);
  await transport.handleRequest(req, res, msg);
});
httpServer.keepAliveTimeout = 60_000;
httpServer.listen(0, '127.0.0.1', () => console.log(httpServer.address().port));
