// Package regularfile reads files named by configuration or by a client
// without letting the name hang or exhaust the process: only regular files
// are read (a FIFO, a device such as /dev/zero, a socket or a directory is
// an error, and opening never blocks), and only up to a size limit.
//
// It holds no state; every call opens and closes its own file.
package regularfile

import (
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
)

// MaxSize is the largest file Read accepts: far above any certificate,
// key or root bundle (a system bundle is a few hundred kilobytes).
const MaxSize = 4 << 20

var (
	// ErrNotRegular is wrapped by the error for a path that is not a
	// regular file.
	ErrNotRegular = errors.New("not a regular file")
	// ErrTooLarge is wrapped by the error for a file over the limit.
	ErrTooLarge = errors.New("file too large")
)

// Open opens path for reading if it is a regular file (after symlinks),
// without blocking on a FIFO.
func Open(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|Flags, 0)
	if err != nil {
		return nil, err
	}
	return check(f, path)
}

// Flags are the open flags Open adds to O_RDONLY, for a caller that opens
// files another way (os.Root) and hands them to ReadWith.
const Flags = syscall.O_NONBLOCK | syscall.O_NOCTTY

// check returns f if it is a regular file, else closes it.
func check(f *os.File, path string) (*os.File, error) {
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, &os.PathError{Op: "open", Path: path, Err: fmt.Errorf("%w (%s)", ErrNotRegular, fi.Mode().Type())}
	}
	return f, nil
}

// Read returns the content of the regular file at path, or an error if it
// is not one or holds more than max bytes (max <= 0 means MaxSize).
func Read(path string, max int64) ([]byte, error) {
	return ReadWith(nil, path, max)
}

// ReadWith is Read with the file opened by open (nil means os.Open's way,
// following links, with Flags): the content of the regular file open
// returns for path, or an error if it is not one or holds more than max
// bytes.
func ReadWith(open func(path string) (*os.File, error), path string, max int64) ([]byte, error) {
	if max <= 0 {
		max = MaxSize
	}
	var (
		f   *os.File
		err error
	)
	if open == nil {
		f, err = Open(path)
	} else if f, err = open(path); err == nil {
		f, err = check(f, path)
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, &os.PathError{Op: "read", Path: path, Err: err}
	}
	if int64(len(data)) > max {
		return nil, &os.PathError{Op: "read", Path: path, Err: fmt.Errorf("%w: more than %d bytes", ErrTooLarge, max)}
	}
	return data, nil
}
