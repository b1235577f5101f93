package main

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
)

// newSocketDirCommand is `meshagent socket-dir --owner <uid>:<gid> <dir>`:
// the node chart's init container, running as root with CAP_CHOWN alone,
// hands the host directory of the socket (which the kubelet makes
// root-owned) to the agent's non-root uid. It makes dir if missing, sets
// it 0755 and owns it to uid:gid; a symbolic link or a file at dir is an
// error. With --private-dir (repeated as needed) it does the same for other
// directories, 0700: the one the CSI driver hands the pods' tokens over to
// the agent in, the socket holder's.
func newSocketDirCommand() *cobra.Command {
	var owner string
	var private []string
	cmd := &cobra.Command{
		Use:   "socket-dir --owner <uid>:<gid> <dir>",
		Short: "Make the socket directory the non-root node agent's (run as root with CAP_CHOWN, before the agent)",
		Args:  cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			uid, gid, err := parseOwner(owner)
			if err != nil {
				return configError(err)
			}
			if err := ownDir(args[0], 0o755, uid, gid); err != nil {
				return runFailure(err)
			}
			for _, dir := range private {
				if err := ownDir(dir, 0o700, uid, gid); err != nil {
					return runFailure(err)
				}
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&owner, "owner", "", "numeric <uid>:<gid> the directory is given to")
	cmd.Flags().StringArrayVar(&private, "private-dir", nil, "another directory made 0700 and given to the owner (the pods' token hand-over of the CSI driver, the socket holder's); may be repeated")
	return cmd
}

func parseOwner(s string) (uid, gid int, err error) {
	u, g, ok := strings.Cut(s, ":")
	if ok {
		uid, err = strconv.Atoi(u)
		if err == nil {
			gid, err = strconv.Atoi(g)
		}
	}
	if !ok || err != nil || uid < 0 || gid < 0 {
		return 0, 0, fmt.Errorf("--owner %q: want numeric <uid>:<gid>", s)
	}
	return uid, gid, nil
}

// ownSocketDir is ownDir of a socket directory, 0755.
func ownSocketDir(dir string, uid, gid int) error { return ownDir(dir, 0o755, uid, gid) }

// ownDir makes dir (mode) if missing and gives it to uid:gid. The mode
// is set only while the caller owns the directory (no CAP_FOWNER needed),
// before the owner is changed (CAP_CHOWN); a directory already the agent's
// is left as it is, so that the command can run at every start.
func ownDir(dir string, mode os.FileMode, uid, gid int) error {
	if err := os.Mkdir(dir, mode); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("making the socket directory: %w", err)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is not a directory (%s)", dir, fi.Mode().Type())
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("%s: no owner information", dir)
	}
	if int(st.Uid) == uid && int(st.Gid) == gid {
		return nil
	}
	if int(st.Uid) == os.Geteuid() {
		if err := os.Chmod(dir, mode); err != nil {
			return fmt.Errorf("setting the socket directory's mode: %w", err)
		}
	}
	if err := os.Lchown(dir, uid, gid); err != nil {
		return fmt.Errorf("giving the socket directory to %d:%d: %w", uid, gid, err)
	}
	return nil
}
