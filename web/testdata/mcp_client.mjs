// The reference TypeScript MCP client against idemgate's /mcp (web/mcp_test.go,
// TestMCPTypeScriptClient): node mcp_client.mjs <endpoint> <api key> <key>.
//
// Client.callTool validates every result's structuredContent against the tool's output schema
// (refusals included) and throws when it does not match, so getting through this script is the
// proof that the schemas idemgate advertises describe its answers. It prints one JSON line:
// what each call answered, or {"error": "..."}.
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';

const [endpoint, apiKey, key] = process.argv.slice(2);

async function main() {
  const transport = new StreamableHTTPClientTransport(new URL(endpoint), {
    requestInit: { headers: { Authorization: `Bearer ${apiKey}` } },
  });
  const client = new Client({ name: 'idemgate-ts-test', version: '1.0.0' });
  await client.connect(transport);
  const summary = {};

  const { tools } = await client.listTools();
  summary.tools = tools.map((t) => t.name);
  summary.read_only = tools.filter((t) => t.annotations?.readOnlyHint).map((t) => t.name);
  for (const t of tools) {
    if (!t.outputSchema || !t.inputSchema) throw new Error(`${t.name} has no input or output schema`);
  }

  const call = async (name, args) => {
    const res = await client.callTool({ name, arguments: args });
    if (res.structuredContent === undefined) throw new Error(`${name} answered no structuredContent`);
    return res;
  };
  const code = (res) => (res.isError ? res.structuredContent.code : 'ok');

  const admit = await call('admit', {
    key, operation: 'charge', ttl_seconds: 60, arguments: { amount: 1200, currency: 'EUR' },
  });
  const adm = admit.structuredContent;
  summary.admitted = !admit.isError && adm.admitted === true;

  const dup = await call('admit', {
    key, operation: 'charge', ttl_seconds: 60, arguments: { currency: 'EUR', amount: 1200 },
  });
  summary.duplicate_names_holder = !dup.isError && dup.structuredContent.admitted === false &&
    dup.structuredContent.operation.id === adm.operation_id;

  summary.conflict = code(await call('admit', {
    key, operation: 'charge', ttl_seconds: 60, arguments: { amount: 1300, currency: 'EUR' },
  }));
  summary.not_owner = code(await call('renew', {
    operation_id: adm.operation_id, owner_token: 'ot_not-the-owner', lease_seconds: 30,
  }));

  const done = await call('complete', {
    operation_id: adm.operation_id, owner_token: adm.owner_token, status: 'succeeded', receipt: 'ch_1',
    result: { charge: 'ch_1', amount: 1200 },
  });
  summary.completed = done.isError ? code(done) : done.structuredContent.state;

  const status = await call('status', { key, wait_seconds: 1 });
  summary.status = status.isError ? code(status) : status.structuredContent.state;
  summary.result = status.structuredContent.outcome?.response ?? null;

  const invalid = await call('admit', { key: 5 });
  summary.invalid = code(invalid);
  summary.invalid_text = invalid.content?.[0]?.text ?? '';

  const queue = await call('list_uncertain', {});
  summary.uncertain = queue.isError ? -1 : queue.structuredContent.items.length;

  await client.close();
  return summary;
}

main().then(
  (summary) => { console.log(JSON.stringify(summary)); },
  (err) => { console.log(JSON.stringify({ error: String(err?.stack ?? err) })); },
);
