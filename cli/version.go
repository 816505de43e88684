package cli

import (
	"fmt"

	"github.com/idemgate/idemgate/web/buildinfo"
	"github.com/spf13/cobra"
)

// versionCmd is `idemgate version`: the build this binary is (the same facts as the
// idemgate_build_info metric). It reads no configuration and opens no database.
func versionCmd(env Env) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the module version, VCS revision and time, and Go release of this binary",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			info := buildinfo.Read()
			rev := orDash(info.Revision)
			if info.Modified {
				rev += " (modified: built with uncommitted changes)"
			}
			fmt.Fprintf(env.Stdout, "idemgate %s\nrevision %s\ntime     %s\ngo       %s\n", info.Version, rev, orDash(info.Time), info.GoVersion)
			return nil
		},
	}
}
