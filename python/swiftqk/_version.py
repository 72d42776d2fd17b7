"""The package's one version: CMake's project(VERSION), the wheel's metadata and
swiftqk.__version__ all read it from this line."""

__version__ = "0.1.0"
