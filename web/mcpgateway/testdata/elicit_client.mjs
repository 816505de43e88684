// An agent whose user confirms: the reference TypeScript MCP client, with an elicitation
// handler that accepts, calls confirm_send through URL twice with one idempotency key.
//
//   node elicit_client.mjs URL KEY TO
//
// Prints one JSON line: {"first": CallToolResult, "second": CallToolResult, "asked": n}.
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { ElicitRequestSchema } from '@modelcontextprotocol/sdk/types.js';

const [url, key, to] = process.argv.slice(2);
let asked = 0;
const client = new Client({ name: 'confirming-agent', version: '1.0.0' }, { capabilities: { elicitation: {} } });
client.setRequestHandler(ElicitRequestSchema, async () => {
  asked++;
  return { action: 'accept', content: { ok: true } };
});
await client.connect(new StreamableHTTPClientTransport(new URL(url)));
await client.listTools();
const call = () => client.callTool({ name: 'confirm_send', arguments: { to, idempotencyKey: key } }, undefined, { timeout: 20_000 });
const first = await call();
const second = await call();
console.log(JSON.stringify({ first, second, asked }));
await client.close();
