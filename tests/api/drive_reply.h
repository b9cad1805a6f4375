// DriveReply: runs a handler's Reply to completion the way the HTTP server
// would (Start, then Poll until the body is complete) and returns its status
// and body, for tests that call ApiService::Handle directly.
//
// The wait is bounded, but generously: sanitizer builds on a loaded 2-core
// machine run the CPU model 10-20x slower than a plain build, and a short
// bound there turned a slow reply into an empty body that read like a product
// bug. Running out of time is reported as a test failure that says so, with
// status -1.
//
// Not thread-safe: one test thread drives one reply.
#pragma once

#include <chrono>
#include <string>
#include <thread>
#include <utility>
#include <variant>

#include <gtest/gtest.h>

#include "api/http_types.h"

namespace agentkv::testing {

inline std::pair<int, std::string> DriveReply(
    api::Reply reply, std::chrono::seconds limit = std::chrono::seconds(600)) {
  if (auto* r = std::get_if<api::HttpResponse>(&reply)) return {r->status, r->body};
  auto& body = std::get<std::unique_ptr<api::AsyncBody>>(reply);
  body->Start([] {});
  std::string out;
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!body->Poll(&out)) {
    if (std::chrono::steady_clock::now() > deadline) {
      ADD_FAILURE() << "the reply did not complete within " << limit.count() << " s; " << out.size()
                    << " bytes so far";
      return {-1, out};
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return {body->status(), out};
}

}  // namespace agentkv::testing
