// Subcommands of the `agentkv` binary register themselves at static
// initialisation, so each command lives in its own file under src/cli/ and
// main.cc needs no list of them.
//
//   static agentkv::cli::Registrar reg("tokenize", "Print token ids as JSON",
//       [](CLI::App& app) { ...add options...; return [=] { return Run(...); }; });
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

namespace agentkv::cli {

// Runs the command after parsing; returns the process exit code.
using Runner = std::function<int()>;
// Adds options to `app` (bound to variables the setup owns) and returns the
// runner that uses them.
using Setup = std::function<Runner(CLI::App& app)>;

struct Command {
  std::string name;  // "tokenize", or "model synth" for a nested command
  std::string description;
  Setup setup;
};

std::vector<Command>& Registry();

struct Registrar {
  Registrar(std::string name, std::string description, Setup setup) {
    Registry().push_back({std::move(name), std::move(description), std::move(setup)});
  }
};

}  // namespace agentkv::cli
