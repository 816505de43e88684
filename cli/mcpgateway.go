package cli

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/idemgate/idemgate/web/mcpgateway"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// mcpGatewayCmd is `idemgate mcp-gateway`: the MCP gateway of web/mcpgateway
// (docs/reference.md §13). Every flag can also come from IDEMGATE_MCP_GATEWAY_<FLAG>; the API
// key comes only from IDEMGATE_API_KEY.
func mcpGatewayCmd(env Env) *cobra.Command {
	var (
		listen, upstream, idemgateURL, path string
		callerHeader                        string
		keyArgs                             []string
		requireKey, replayToolErrors        bool
		ttl, wait, timeout                  time.Duration
	)
	cmd := &cobra.Command{
		Use:   "mcp-gateway --listen ADDR --upstream URL --idemgate URL",
		Short: "Serve an MCP gateway that never lets a retried tool call repeat its effect",
		Long: "Forward the Model Context Protocol (streamable HTTP) to the MCP server at --upstream; a\n" +
			"tools/call of a tool not marked readOnlyHint that carries an idempotency key (the idempotencyKey\n" +
			"argument the gateway adds to its schema, or _meta[\"io.idemgate/key\"]) is admitted through the\n" +
			"idemgate server at --idemgate first: forwarded once, its result replayed to repeats, and a call\n" +
			"whose answer was lost reported as \"outcome unknown\", never forwarded again. The API key is\n" +
			"IDEMGATE_API_KEY. Every flag may also be set as IDEMGATE_MCP_GATEWAY_<FLAG>.\n" +
			"See docs/reference.md §13.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := flagsFromEnv(cmd.Flags(), env.Getenv, mcpGatewayEnvName); err != nil {
				return err
			}
			apiKey := env.Getenv("IDEMGATE_API_KEY")
			switch {
			case listen == "" || upstream == "" || idemgateURL == "":
				return errors.New("--listen, --upstream and --idemgate are required (or IDEMGATE_MCP_GATEWAY_LISTEN, …)")
			case apiKey == "":
				return errors.New("IDEMGATE_API_KEY is not set: the gateway admits tool calls with an idemgate API key")
			}
			args := map[string]string{}
			for _, kv := range keyArgs {
				tool, arg, ok := strings.Cut(kv, "=")
				if !ok || tool == "" || arg == "" {
					return fmt.Errorf("--key-argument %q: want TOOL=ARGUMENT", kv)
				}
				args[tool] = arg
			}
			log := slog.New(slog.NewJSONHandler(env.Stderr, nil))
			idem, err := idemgateClient(cmd.Context(), idemgateURL, apiKey, log, "keyed tool calls get store_unavailable")
			if err != nil {
				return err
			}
			if wait == 0 {
				wait = -1 // the flag's 0 is "no wait"; the Config's 0 is its default
			}
			app, err := mcpgateway.New(mcpgateway.Config{Upstream: upstream, Client: idem, Path: path, KeyArguments: args,
				RequireKey: requireKey, CallerHeader: callerHeader, ReplayToolErrors: replayToolErrors, TTL: ttl, Wait: wait, UpstreamTimeout: timeout, Logger: log})
			if err != nil {
				return err
			}
			return serveUntilSignal(cmd.Context(), app, listen, path, timeout+proxyOutcomeMargin,
				log.With("upstream", upstream, "idemgate", idemgateURL), "mcp-gateway")
		},
	}
	f := cmd.Flags()
	f.StringVar(&listen, "listen", "", "address to serve on, e.g. 127.0.0.1:8091")
	f.StringVar(&upstream, "upstream", "", "the MCP server's endpoint URL, e.g. http://127.0.0.1:3000/mcp")
	f.StringVar(&idemgateURL, "idemgate", "", "the idemgate server's URL, e.g. http://127.0.0.1:8080")
	f.StringVar(&path, "path", "/mcp", "the path the gateway serves the endpoint at")
	f.StringSliceVar(&keyArgs, "key-argument", nil, "TOOL=ARGUMENT: an argument of the tool's own that carries its idempotency key")
	f.BoolVar(&requireKey, "require-key", false, "answer a guarded tool call without a key with an error instead of forwarding it")
	f.StringVar(&callerHeader, "caller-header", "", "scope keys by a hash of this request header too, e.g. Authorization (else all callers share keys)")
	f.BoolVar(&replayToolErrors, "replay-tool-errors", false, "record a tool error (isError) as the outcome and replay it (default: release the key)")
	f.DurationVar(&ttl, "ttl", 24*time.Hour, "how long a key is held (whole seconds, more than --upstream-timeout); repeats within it replay")
	f.DurationVar(&wait, "wait", 30*time.Second, "how long a repeat waits for a first call still running (0: answer request_in_progress at once)")
	f.DurationVar(&timeout, "upstream-timeout", 60*time.Second, "bound of one guarded call; past it the outcome is unknown")
	f.VisitAll(func(fl *pflag.Flag) { fl.Usage += " [$" + mcpGatewayEnvName(fl.Name) + "]" })
	return cmd
}

// mcpGatewayEnvName is the environment variable of an mcp-gateway flag: upstream-timeout →
// IDEMGATE_MCP_GATEWAY_UPSTREAM_TIMEOUT.
func mcpGatewayEnvName(flag string) string {
	return "IDEMGATE_MCP_GATEWAY_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}
