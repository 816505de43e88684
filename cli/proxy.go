package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/idemgate/idemgate/web/client"
	"github.com/idemgate/idemgate/web/proxy"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// proxyOutcomeMargin is added to --upstream-timeout to bound the wait for requests in flight
// when the proxy stops: each one may take the whole upstream timeout, and its outcome must
// still be recorded at idemgate (fibermw's WriteTimeout, 10 s). A shorter bound cut requests
// off after their effect, unrecorded, and their keys answered 409 until the TTL.
const proxyOutcomeMargin = 15 * time.Second

// proxyCmd is `idemgate proxy`: the Idempotency-Key reverse proxy of web/proxy
// (docs/reference.md "The proxy"). Every flag can also come from the environment variable
// IDEMGATE_PROXY_<FLAG> (upper case, dashes as underscores); a flag given wins. The API key
// comes only from IDEMGATE_API_KEY, so it never shows in a process list.
func proxyCmd(env Env) *cobra.Command {
	var (
		listen, upstream, idemgateURL, callerHeader, docURL string
		methods, requireKey, replayHeaders, operations      []string
		noEffect                                            []int
		ttl, lease, wait, timeout                           time.Duration
	)
	cmd := &cobra.Command{
		Use:   "proxy --listen ADDR --upstream URL --idemgate URL",
		Short: "Serve an Idempotency-Key reverse proxy in front of any HTTP service",
		Long: "Forward every request to --upstream; requests on a guarded method (POST, PATCH) with an\n" +
			"Idempotency-Key header are admitted through the idemgate server at --idemgate first, so each\n" +
			"key's request reaches the upstream at most once and repeats get its response replayed\n" +
			"(Idempotent-Replayed: true), 409 while it runs or when its outcome is unknown, 422 for another\n" +
			"request with the same key. The API key is IDEMGATE_API_KEY. Every flag may also be set as\n" +
			"IDEMGATE_PROXY_<FLAG> (e.g. IDEMGATE_PROXY_UPSTREAM); a flag on the command line wins.\n" +
			"See docs/reference.md, \"The proxy\".",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := proxyFlagsFromEnv(cmd.Flags(), env.Getenv); err != nil {
				return err
			}
			apiKey := env.Getenv("IDEMGATE_API_KEY")
			switch {
			case listen == "" || upstream == "" || idemgateURL == "":
				return errors.New("--listen, --upstream and --idemgate are required (or IDEMGATE_PROXY_LISTEN, …)")
			case apiKey == "":
				return errors.New("IDEMGATE_API_KEY is not set: the proxy admits requests with an idemgate API key")
			}
			log := slog.New(slog.NewJSONHandler(env.Stderr, nil))
			idem, err := idemgateClient(cmd.Context(), idemgateURL, apiKey, log, "keyed requests get 503")
			if err != nil {
				return err
			}
			ops, err := proxy.ParseOperations(operations)
			if err != nil {
				return fmt.Errorf("--operation: %w", err)
			}
			app, err := proxy.New(proxy.Config{Upstream: upstream, Client: idem, Methods: methods, RequireKey: requireKey,
				Operations:   ops,
				CallerHeader: callerHeader, ReplayHeaders: replayHeaders, TTL: ttl, Lease: lease, Wait: wait,
				NoEffect5xx: noEffect, UpstreamTimeout: timeout, DocumentationURL: docURL, Logger: log})
			if err != nil {
				return err
			}
			return serveUntilSignal(cmd.Context(), app, listen, "", timeout+proxyOutcomeMargin,
				log.With("upstream", upstream, "idemgate", idemgateURL), "proxy")
		},
	}
	f := cmd.Flags()
	f.StringVar(&listen, "listen", "", "address to serve on, e.g. 127.0.0.1:8090")
	f.StringVar(&upstream, "upstream", "", "the service's base URL, e.g. http://127.0.0.1:3000")
	f.StringVar(&idemgateURL, "idemgate", "", "the idemgate server's URL, e.g. http://127.0.0.1:8080")
	f.StringSliceVar(&methods, "methods", []string{"POST", "PATCH"}, "guarded methods")
	f.StringSliceVar(&requireKey, "require-key", nil, "path prefixes whose guarded requests must carry a key (else 400)")
	f.StringSliceVar(&operations, "operation", nil, "PREFIX=NAME: the operation name of guarded requests under a path prefix, e.g. /v1/charges=charge.create")
	f.StringVar(&callerHeader, "caller-header", "", "scope keys by a hash of this request header too, e.g. Authorization")
	f.StringSliceVar(&replayHeaders, "replay-header", nil, "response headers replayed with a repeat (default Content-Type, Location, ETag, …)")
	f.StringVar(&docURL, "doc-url", "", "the page documenting your idempotency rules, linked from the proxy's own errors")
	f.IntSliceVar(&noEffect, "no-effect-5xx", nil, "upstream 5xx statuses meaning nothing was done (key released), e.g. 503")
	f.DurationVar(&ttl, "ttl", 24*time.Hour, "how long a key is held (whole seconds)")
	f.DurationVar(&lease, "lease", 0, "renewed lease while the upstream works (0: the TTL)")
	f.DurationVar(&wait, "wait", 0, "a repeat in flight waits up to this long and replays (0: 409 at once)")
	f.DurationVar(&timeout, "upstream-timeout", 30*time.Second, "bound of one guarded request (of a pass-through one, until its answer's headers); past it the outcome is unknown")
	f.VisitAll(func(fl *pflag.Flag) { fl.Usage += " [$" + proxyEnvName(fl.Name) + "]" }) // before cobra adds --help
	return cmd
}

// serveUntilSignal serves app on listen until it fails or SIGINT or SIGTERM comes, then stops
// accepting and waits up to grace for the requests in flight, whose outcomes must still be
// recorded (`proxy` and `mcp-gateway`: the upstream timeout and proxyOutcomeMargin). path is
// added to the address logged; what names the command in the log.
func serveUntilSignal(ctx context.Context, app *fiber.App, listen, path string, grace time.Duration, log *slog.Logger, what string) error {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return fmt.Errorf("--listen %s: %w", listen, err)
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	served := make(chan error, 1)
	go func() { served <- app.Listener(ln) }()
	log.Info(what+" listening", "addr", "http://"+ln.Addr().String()+path)
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	log.Info(what + " stopping: finishing requests in flight")
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), grace)
	defer cancel()
	return app.ShutdownWithContext(sctx)
}

// idemgateClient is the client of `proxy` and `mcp-gateway` for the idemgate server at url,
// with apiKey checked at once: a wrong key would otherwise show only as refusals of the first
// requests. An idemgate that cannot be asked yet is not an error (it may come later); log
// hears what callers get meanwhile (until).
func idemgateClient(ctx context.Context, url, apiKey string, log *slog.Logger, until string) (*client.Client, error) {
	idem, err := client.New(url, apiKey)
	if err != nil {
		return nil, fmt.Errorf("--idemgate: %w", err)
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	_, err = idem.ListKeys(cctx, client.ListKeysOptions{Limit: 1})
	cancel()
	switch {
	case errors.Is(err, client.ErrUnauthorized):
		return nil, fmt.Errorf("IDEMGATE_API_KEY is not accepted by idemgate at %s", url)
	case err != nil:
		log.Warn("idemgate cannot be asked yet; "+until+" until it can", "idemgate", url, "err", err)
	}
	return idem, nil
}

// proxyFlagsFromEnv sets every flag not given on the command line from IDEMGATE_PROXY_<FLAG>.
func proxyFlagsFromEnv(fs *pflag.FlagSet, getenv func(string) string) error {
	return flagsFromEnv(fs, getenv, proxyEnvName)
}

// flagsFromEnv sets every flag of fs not given on the command line from the environment
// variable envName(flag) (comma-separated for list flags), as `proxy` and `mcp-gateway` read
// their configuration.
func flagsFromEnv(fs *pflag.FlagSet, getenv func(string) string, envName func(string) string) error {
	var err error
	fs.VisitAll(func(fl *pflag.Flag) {
		if fl.Name == "help" {
			return
		}
		name := envName(fl.Name)
		if v := getenv(name); v != "" && !fl.Changed && err == nil {
			if fl.Value.Type() == "stringSlice" || fl.Value.Type() == "intSlice" {
				if sv, ok := fl.Value.(pflag.SliceValue); ok {
					parts := strings.Split(v, ",")
					if fl.Value.Type() == "intSlice" {
						for _, p := range parts {
							if _, e := strconv.Atoi(strings.TrimSpace(p)); e != nil {
								err = fmt.Errorf("%s=%s: %q is not a status", name, v, p)
								return
							}
						}
					}
					err = sv.Replace(parts)
					return
				}
			}
			if e := fl.Value.Set(v); e != nil {
				err = fmt.Errorf("%s=%s: %w", name, v, e)
			}
		}
	})
	return err
}

// proxyEnvName is the environment variable of a proxy flag: upstream-timeout →
// IDEMGATE_PROXY_UPSTREAM_TIMEOUT.
func proxyEnvName(flag string) string {
	return "IDEMGATE_PROXY_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}
