module linerate-tests/llhls-packager

go 1.19

require (
	github.com/bluenviron/gohlslib v1.2.0
	github.com/bluenviron/mediacommon v1.6.0
)

require (
	github.com/abema/go-mp4 v1.1.1 // indirect
	github.com/aler9/writerseeker v1.1.0 // indirect
	github.com/asticode/go-astikit v0.30.0 // indirect
	github.com/asticode/go-astits v1.13.0 // indirect
	github.com/google/uuid v1.3.0 // indirect
)
