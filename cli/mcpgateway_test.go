package cli

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestMCPGatewayConfiguration: mcp-gateway's flags come from IDEMGATE_MCP_GATEWAY_<FLAG> too
// (the command line wins), and an incomplete or unusable configuration is refused with what
// is wrong before anything is served.
func TestMCPGatewayConfiguration(t *testing.T) {
	env := map[string]string{"IDEMGATE_MCP_GATEWAY_UPSTREAM": "http://127.0.0.1:3000/mcp",
		"IDEMGATE_MCP_GATEWAY_KEY_ARGUMENT": "send_email=request_id,pay=ref", "IDEMGATE_MCP_GATEWAY_REQUIRE_KEY": "true",
		"IDEMGATE_MCP_GATEWAY_WAIT": "3s"}
	cmd := mcpGatewayCmd(Env{})
	require.NoError(t, cmd.Flags().Parse([]string{"--wait", "1s"}))
	require.NoError(t, flagsFromEnv(cmd.Flags(), func(k string) string { return env[k] }, mcpGatewayEnvName))
	get := func(name string) string { return cmd.Flags().Lookup(name).Value.String() }
	require.Equal(t, "http://127.0.0.1:3000/mcp", get("upstream"))
	require.Equal(t, "[send_email=request_id,pay=ref]", get("key-argument"))
	require.Equal(t, "true", get("require-key"))
	require.Equal(t, "1s", get("wait"), "the command line wins")
	require.Contains(t, cmd.Flags().Lookup("ttl").Usage, "$IDEMGATE_MCP_GATEWAY_TTL")

	addrs := []string{"--listen", "127.0.0.1:0", "--upstream", "http://127.0.0.1:1/mcp", "--idemgate", "http://127.0.0.1:2"}
	key := map[string]string{"IDEMGATE_API_KEY": "idg_x"}
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{nil, nil, "--listen, --upstream and --idemgate are required"},
		{addrs, nil, "IDEMGATE_API_KEY is not set"},
		{append(addrs, "--key-argument", "send_email"), key, "want TOOL=ARGUMENT"},
		{append(addrs, "--ttl", "30s"), key, "more than the upstream timeout"},
		{[]string{"--listen", "127.0.0.1:0", "--upstream", "mcp://x", "--idemgate", "http://127.0.0.1:2"}, key,
			"want an absolute http"},
	} {
		var out bytes.Buffer
		err := Execute(t.Context(), append([]string{"mcp-gateway"}, tc.args...),
			Env{Getenv: func(k string) string { return tc.env[k] }, Stdin: strings.NewReader(""), Stdout: &out, Stderr: &out})
		require.ErrorContains(t, err, tc.want, "%v", tc.args)
	}
}
