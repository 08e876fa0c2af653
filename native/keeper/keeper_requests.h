// One request's meaning: decodes its payload, acts on the store and encodes the reply
// (docs/keeper.md lists the ops). Bad input throws KeeperError; the loop then replies with its
// code and closes the connection.
#pragma once
#include <sys/types.h>

#include <string>
#include <vector>

#include "keeper_connection.h"
#include "keeper_store.h"

namespace weightd::keeper {

struct Reply {
  std::vector<uint8_t> frame;  // empty: no reply (WATCH)
  std::vector<int> fds;        // dups the connection sends and then closes
  std::string logMsg;          // an event worth an info line; empty for none
  std::string device, fingerprint;
};

struct KeeperInfo {
  pid_t pid;
  Clock::time_point started;
};

// Takes the request's fds: a KEEP's go to the store, any other's are closed.
Reply handleRequest(Store& store, const KeeperInfo& keeper, Connection& from, Request request);

}  // namespace weightd::keeper
