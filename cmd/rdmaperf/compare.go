package main

import (
	"context"
	"errors"
)

func runCompare(ctx context.Context, out string) error { return errors.New("not yet") }
