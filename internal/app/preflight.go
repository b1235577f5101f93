package app

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// maxSocketPath is the longest Unix socket path Linux binds (sun_path
// holds 108 bytes, one of them the terminating NUL).
const maxSocketPath = 107

// checkSocketPath finds at start-up what would make listening on a Unix
// socket at path fail later, naming the setting and what to change: a path
// too long for a socket address, a directory there (or, unless replace,
// anything else that is not a socket), or a directory that cannot be made
// or written. It makes nothing that stays (a
// probe directory is made and removed where the socket's directory would
// be created).
func checkSocketPath(setting, path string, replace bool) error {
	abs, err := filepath.Abs(path)
	if err != nil {
		return fmt.Errorf("%s=%s: %w", setting, path, err)
	}
	fail := func(why string) error {
		return fmt.Errorf("%s=%s cannot hold a Unix socket: %s; set %s to a path in a writable directory", setting, path, why, setting)
	}
	if len(abs) > maxSocketPath {
		return fail(fmt.Sprintf("the absolute path is %d bytes, longer than a socket address (%d)", len(abs), maxSocketPath))
	}
	if st, err := os.Lstat(abs); err == nil {
		if t := st.Mode().Type(); t != fs.ModeSocket && (!replace || t == fs.ModeDir) {
			return fail("it exists and is not a socket (" + st.Mode().Type().String() + ")")
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fail(err.Error())
	}
	// The nearest directory that exists must let the agent make what is
	// missing below it (or, when it is the socket's own, bind in it).
	if why := probeNearestDir(abs, true); why != "" {
		return fail(why)
	}
	return nil
}

// checkFilePath finds at start-up what would make writing a file at path
// fail later, naming the setting and what to change: a directory at the
// path, or a directory that cannot be made or written on the way to it. It
// makes nothing that stays (a probe file is made and removed where the
// file's directory is, or would be created).
func checkFilePath(setting, path string) error {
	abs, err := filepath.Abs(path)
	if err != nil {
		return fmt.Errorf("%s=%s: %w", setting, path, err)
	}
	fail := func(why string) error {
		return fmt.Errorf("%s=%s cannot be written: %s; set %s to a path in a writable directory", setting, path, why, setting)
	}
	if st, err := os.Stat(abs); err == nil && st.IsDir() {
		return fail("it is a directory")
	}
	if why := probeNearestDir(abs, false); why != "" {
		return fail(why)
	}
	return nil
}

// probeNearestDir says why nothing could be made at abs (empty when
// something can): the nearest existing directory above abs is not a
// directory, or a probe (a directory with mkdir, else a file) cannot be
// created in it. The probe is removed.
func probeNearestDir(abs string, mkdir bool) string {
	dir := filepath.Dir(abs)
	for {
		st, err := os.Stat(dir)
		if err == nil {
			if !st.IsDir() {
				return dir + " is not a directory"
			}
			break
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return err.Error()
		}
		dir = filepath.Dir(dir)
	}
	var probe string
	var err error
	if mkdir {
		probe, err = os.MkdirTemp(dir, ".meshagent-probe-")
	} else {
		var f *os.File
		if f, err = os.CreateTemp(dir, ".meshagent-probe-"); err == nil {
			probe = f.Name()
			_ = f.Close()
		}
	}
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err // the probe's own name says nothing to the user
		}
		return fmt.Sprintf("cannot create in %s: %v", dir, err)
	}
	_ = os.Remove(probe)
	return ""
}
