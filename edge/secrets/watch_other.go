//go:build !linux

package secrets

import "errors"

// changeWatch is Linux's (inotify); elsewhere the file is checked on every
// read.
type changeWatch struct{}

func newChangeWatch(string) (*changeWatch, error) {
	return nil, errors.New("no change watch on this system")
}

func (*changeWatch) changed() bool { return true }
func (*changeWatch) close()        {}
