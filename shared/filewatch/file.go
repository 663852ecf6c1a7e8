package filewatch

// File is a file and its last reading: what read made of it, taken after
// the stamp it is compared by, so a change made during a read is seen by
// the next Check. A reading is kept whether read succeeded or not: what a
// failed reading means (keep the old policy, fail closed) is the user's
// call, and the file is read again only once it changes.
//
// File is not safe for concurrent use: its user serialises Check and
// Reload under the lock that also guards what it derives from a reading.
type File[T any] struct {
	path string
	read func(path string) (T, error)

	stamp Stamp
	value T
	err   error
	done  bool // a reading was taken
}

// New returns a File for path with no reading yet: the first Check reads
// it. read turns the file's content into a T; its error must not quote the
// content (it may hold secrets).
func New[T any](path string, read func(path string) (T, error)) *File[T] {
	return &File[T]{path: path, read: read}
}

// Path is the file's path.
func (f *File[T]) Path() string { return f.path }

// Check re-reads the file when its stamp differs from the last reading's,
// or when it has none, and reports whether it did. err is only a failure
// to stat the file (it is missing, say): the last reading stays, and the
// file is read again once it can be stamped.
func (f *File[T]) Check() (reread bool, err error) {
	stamp, err := Of(f.path)
	if err != nil {
		return false, err
	}
	if f.done && stamp == f.stamp {
		return false, nil
	}
	f.take(stamp)
	return true, nil
}

// Reload re-reads the file whatever its stamp (an operator's SIGHUP, a
// change a watch reported: a stamp cannot prove a file unchanged). A
// file that cannot be stamped is read all the same, so the reading carries
// read's error, and the zero stamp it is kept with makes the next Check
// read it again once it is back.
func (f *File[T]) Reload() {
	stamp, _ := Of(f.path)
	f.take(stamp)
}

// Reading returns the last reading: what read returned. Before any reading
// it is the zero T and a nil error.
func (f *File[T]) Reading() (T, error) { return f.value, f.err }

func (f *File[T]) take(stamp Stamp) {
	f.stamp = stamp
	f.value, f.err = f.read(f.path)
	f.done = true
}
