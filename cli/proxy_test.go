package cli

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"
)

// TestProxyFlagsFromEnvironment: every proxy flag can come from IDEMGATE_PROXY_<FLAG>, a flag
// on the command line wins, lists are comma-separated, and a bad value is an error naming the
// variable.
func TestProxyFlagsFromEnvironment(t *testing.T) {
	env := map[string]string{"IDEMGATE_PROXY_UPSTREAM": "http://127.0.0.1:3000", "IDEMGATE_PROXY_LISTEN": "127.0.0.1:1",
		"IDEMGATE_PROXY_NO_EFFECT_5XX": "503,504", "IDEMGATE_PROXY_METHODS": "POST,PUT", "IDEMGATE_PROXY_WAIT": "2s"}
	cmd := proxyCmd(Env{Getenv: func(k string) string { return env[k] }})
	require.NoError(t, cmd.Flags().Parse([]string{"--listen", "127.0.0.1:2"}))
	require.NoError(t, proxyFlagsFromEnv(cmd.Flags(), func(k string) string { return env[k] }))
	get := func(name string) string { return cmd.Flags().Lookup(name).Value.String() }
	require.Equal(t, "http://127.0.0.1:3000", get("upstream"))
	require.Equal(t, "127.0.0.1:2", get("listen"), "the command line wins")
	require.Equal(t, "[503,504]", get("no-effect-5xx"))
	require.Equal(t, "[POST,PUT]", get("methods"))
	require.Equal(t, "2s", get("wait"))

	bad := proxyCmd(Env{})
	err := proxyFlagsFromEnv(bad.Flags(), func(k string) string {
		return map[string]string{"IDEMGATE_PROXY_NO_EFFECT_5XX": "503,x"}[k]
	})
	require.ErrorContains(t, err, "IDEMGATE_PROXY_NO_EFFECT_5XX")
}

// TestProxyCommandRefusesIncompleteConfiguration: without the three addresses or the API key
// the command says what is missing and serves nothing.
func TestProxyCommandRefusesIncompleteConfiguration(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{nil, nil, "--listen, --upstream and --idemgate are required"},
		{[]string{"--listen", "127.0.0.1:0", "--upstream", "http://127.0.0.1:1", "--idemgate", "http://127.0.0.1:2"}, nil,
			"IDEMGATE_API_KEY is not set"},
		{[]string{"--listen", "127.0.0.1:0", "--upstream", "ftp://x", "--idemgate", "http://127.0.0.1:2"},
			map[string]string{"IDEMGATE_API_KEY": "idg_x"}, "want an absolute http"},
		{[]string{"--listen", "127.0.0.1:0", "--upstream", "http://127.0.0.1:1", "--idemgate", "http://127.0.0.1:2",
			"--ttl", "1500ms"}, map[string]string{"IDEMGATE_API_KEY": "idg_x"}, "whole seconds"},
		{[]string{"--listen", "127.0.0.1:0", "--upstream", "http://127.0.0.1:1", "--idemgate", "http://127.0.0.1:2",
			"--ttl", "20s"}, map[string]string{"IDEMGATE_API_KEY": "idg_x"}, "more than the upstream timeout"},
	} {
		var out bytes.Buffer
		err := Execute(t.Context(), append([]string{"proxy"}, tc.args...),
			Env{Getenv: func(k string) string { return tc.env[k] }, Stdin: strings.NewReader(""), Stdout: &out, Stderr: &out})
		require.ErrorContains(t, err, tc.want, "%v", tc.args)
	}
}

// FuzzProxyFlagsFromEnvironment: whatever the environment holds, reading it into the flags
// never panics, and a value it accepts is one the flag itself parses.
func FuzzProxyFlagsFromEnvironment(f *testing.F) {
	for _, s := range []string{"503", "503,504", "", ",", "x", "2s", "-1s", "POST,,PATCH", "99999999999999999999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		cmd := proxyCmd(Env{})
		err := proxyFlagsFromEnv(cmd.Flags(), func(string) string { return v })
		if err != nil {
			return
		}
		cmd.Flags().VisitAll(func(fl *pflag.Flag) {
			if fl.Name == "help" {
				return
			}
			require.NotPanics(t, func() { _ = fl.Value.String() })
		})
	})
}

// TestProxyRefusesAnAPIKeyIdemgateRejects: the proxy asks idemgate once at start; a key it
// answers 401 for stops the proxy with a clear message, instead of 503s at every request.
func TestProxyRefusesAnAPIKeyIdemgateRejects(t *testing.T) {
	idem := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(http.StatusUnauthorized)
		_, _ = w.Write([]byte(`{"type":"about:blank","title":"Unauthorized","status":401,"code":"unauthorized"}`))
	}))
	t.Cleanup(idem.Close)
	var out bytes.Buffer
	err := Execute(t.Context(), []string{"proxy", "--listen", "127.0.0.1:0", "--upstream", "http://127.0.0.1:1",
		"--idemgate", idem.URL}, Env{Getenv: func(k string) string {
		return map[string]string{"IDEMGATE_API_KEY": "idg_wrong"}[k]
	}, Stdin: strings.NewReader(""), Stdout: &out, Stderr: &out})
	require.ErrorContains(t, err, "IDEMGATE_API_KEY is not accepted")
}
