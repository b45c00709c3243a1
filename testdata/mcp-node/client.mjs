// An MCP client built on the official TypeScript SDK, for keybrake's end-to-end
// tests: it connects to KEYBRAKE_MCP_URL with KEYBRAKE_VAULT_KEY as the bearer
// token, lists the tools, calls KEYBRAKE_MCP_TOOL with the JSON arguments in
// KEYBRAKE_MCP_ARGS, and prints {server, tools, result} as one line of JSON.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const env = (name) => {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set`);
  return v;
};

const transport = new StreamableHTTPClientTransport(new URL(env("KEYBRAKE_MCP_URL")), {
  requestInit: { headers: { Authorization: `Bearer ${env("KEYBRAKE_VAULT_KEY")}` } },
});
const client = new Client({ name: "keybrake-node-e2e", version: "1.0.0" });
await client.connect(transport);

const { tools } = await client.listTools();
const result = await client.callTool({
  name: env("KEYBRAKE_MCP_TOOL"),
  arguments: JSON.parse(process.env.KEYBRAKE_MCP_ARGS || "{}"),
});
console.log(JSON.stringify({
  server: client.getServerVersion(),
  tools: tools.map((t) => ({ name: t.name, annotations: t.annotations, required: t.inputSchema.required ?? [] })),
  result,
}));
await client.close();
