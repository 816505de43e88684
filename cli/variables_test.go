package cli

import (
	"io"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/idemgate/idemgate/services"
	"github.com/stretchr/testify/require"
)

// TestLoadConfigReadsOnlyTheTable: every variable LoadConfig reads is a row of Variables and
// every row is read, so `serve --help` and docs/operations.md describe exactly what serve reads.
func TestLoadConfigReadsOnlyTheTable(t *testing.T) {
	read := map[string]bool{}
	_, err := LoadConfig(func(name string) string { read[name] = true; return "" })
	require.NoError(t, err)
	var names []string
	for _, v := range Variables {
		names = append(names, v.Name)
	}
	var got []string
	for n := range read {
		got = append(got, n)
	}
	sort.Strings(names)
	sort.Strings(got)
	require.Equal(t, names, got)
}

// TestVariablesMatchOperationsManual: the Configuration table of docs/operations.md lists the
// same variables, in the same order, with the same defaults as Variables.
func TestVariablesMatchOperationsManual(t *testing.T) {
	manual, err := os.ReadFile("../docs/operations.md")
	require.NoError(t, err)
	section := string(manual)
	start := strings.Index(section, "\n## Configuration\n")
	require.Positive(t, start, "docs/operations.md has a Configuration section")
	section = section[start+1:]
	if end := strings.Index(section[3:], "\n## "); end > 0 {
		section = section[:end+3]
	}
	row := regexp.MustCompile("(?m)^\\| `([A-Z_]+)` \\| ([^|]+) \\|")
	var manualRows, tableRows []string
	for _, m := range row.FindAllStringSubmatch(section, -1) {
		manualRows = append(manualRows, m[1]+" = "+strings.ReplaceAll(strings.TrimSpace(m[2]), "`", ""))
	}
	for _, v := range Variables {
		tableRows = append(tableRows, v.Name+" = "+v.ShownDefault())
	}
	require.Equal(t, tableRows, manualRows, "docs/operations.md's Configuration table and cli.Variables disagree")
}

// TestVariableDefaultsAreTheServicesDefaults: the table's defaults are the ones the services
// document (a default changed in one place only would show one value and apply another).
func TestVariableDefaultsAreTheServicesDefaults(t *testing.T) {
	c, err := LoadConfig(env(nil))
	require.NoError(t, err)
	require.Equal(t, services.DefaultMaxTTL, c.MaxTTL)
	require.Equal(t, services.DefaultRetention, c.Retention)
	require.Equal(t, DefaultStoreTimeout, c.StoreTimeout)
	require.True(t, c.GroupAdmission)
	require.Equal(t, services.LingerOff, c.GroupLinger)
	require.False(t, c.SecureCookies)
}

// TestGroupLingerIsReadOrRefused: IDEMGATE_GROUP_LINGER takes auto, on or off; anything else
// stops every command at configuration, naming the variable and the values it takes.
func TestGroupLingerIsReadOrRefused(t *testing.T) {
	for v, want := range map[string]services.LingerMode{"auto": services.LingerAuto, "on": services.LingerOn, "off": services.LingerOff} {
		c, err := LoadConfig(env(map[string]string{"IDEMGATE_GROUP_LINGER": v}))
		require.NoError(t, err, v)
		require.Equal(t, want, c.GroupLinger, v)
	}
	for _, bad := range []string{"true", "false", "ON", "sometimes"} {
		_, err := LoadConfig(env(map[string]string{"IDEMGATE_GROUP_LINGER": bad}))
		require.ErrorContains(t, err, "IDEMGATE_GROUP_LINGER", bad)
		require.ErrorContains(t, err, "auto, on or off", bad)
	}
}

// TestServeHelpListsEveryVariable: `serve --help` (and `idemgate --help`) print every variable
// with its default.
func TestServeHelpListsEveryVariable(t *testing.T) {
	for _, args := range [][]string{{"serve", "--help"}, {"--help"}} {
		out, _, err := run(t, nil, "", args...)
		require.NoError(t, err)
		for _, v := range Variables {
			require.Regexp(t, regexp.MustCompile(`(?m)^  `+v.Name+` +`+regexp.QuoteMeta("(default "+v.ShownDefault()+")")), out, "%v: %s", args, v.Name)
		}
	}
}

// TestBadAddrIsRefusedAtConfiguration: an IDEMGATE_ADDR that is no host:port stops every
// command before any database is opened.
func TestBadAddrIsRefusedAtConfiguration(t *testing.T) {
	for _, bad := range []string{"8080", "localhost", "http://127.0.0.1:8080"} {
		_, err := LoadConfig(env(map[string]string{"IDEMGATE_ADDR": bad}))
		require.ErrorContains(t, err, "IDEMGATE_ADDR", bad)
	}
	for _, ok := range []string{":8080", "0.0.0.0:0", "[::1]:8080", "localhost:8080"} {
		_, err := LoadConfig(env(map[string]string{"IDEMGATE_ADDR": ok}))
		require.NoError(t, err, ok)
	}
}

// TestHelpShowsCommandsFirst: `idemgate --help` lists the commands before the environment
// variables, which run to dozens of lines (issue 28 item 16).
func TestHelpShowsCommandsFirst(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"serve", "--help"}} {
		out, _, err := run(t, nil, "", args...)
		require.NoError(t, err)
		usage, vars := strings.Index(out, "Usage:"), strings.Index(out, "DATABASE_URL")
		require.True(t, usage >= 0 && vars > usage, "%v: usage at %d, variables at %d", args, usage, vars)
	}
	out, _, err := run(t, nil, "", "--help")
	require.NoError(t, err)
	require.Less(t, strings.Index(out, "apikey"), strings.Index(out, "DATABASE_URL"))
	// A group's help is about the group: no environment there.
	out, _, err = run(t, nil, "", "apikey", "--help")
	require.NoError(t, err)
	require.NotContains(t, out, "DATABASE_URL")
}

// TestUnknownSubcommandFails: a mistyped subcommand of any group is an error naming it, exit
// status non-zero, never the group's help with status 0 (issue 28 item 16); the group alone
// still prints its help.
func TestUnknownSubcommandFails(t *testing.T) {
	root := newRoot(Env{Getenv: env(nil), Stdin: strings.NewReader(""), Stdout: io.Discard, Stderr: io.Discard})
	groups := 0
	for _, c := range root.Commands() {
		if !c.HasSubCommands() {
			continue
		}
		groups++
		_, _, err := run(t, nil, "", c.Name(), "lst")
		require.ErrorContains(t, err, `unknown command "lst"`, c.Name())
		out, _, err := run(t, nil, "", c.Name())
		require.NoError(t, err, c.Name())
		require.Contains(t, out, "Available Commands", c.Name())
	}
	require.GreaterOrEqual(t, groups, 5, "apikey, operator, tenant, webhook and completion")
	_, _, err := run(t, nil, "", "sevre")
	require.ErrorContains(t, err, `unknown command "sevre"`)
}
