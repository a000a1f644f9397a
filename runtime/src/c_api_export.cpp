// libkjit.so is the runtime core linked whole; this file only gives the target a source.
