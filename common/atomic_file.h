// Every file a Stepcast program writes goes through here.
//  - Whole files: the text goes to a temporary file in the same folder (an
//    unpredictable name, created with O_EXCL, so a planted file or link fails
//    the write instead of redirecting it), is synced, renamed over the target,
//    and the folder is synced, so that after a crash the target holds the old
//    text or the new, never a part.
//  - Logs (JSONL): each record is appended with one write(2) of the whole line
//    to a file opened O_APPEND, so that concurrent writers do not interleave and
//    a crash leaves at most one torn last line, which readers skip with a warning.
// A folder that does not exist or a path that is a folder is an InputError; a
// write the system refuses (disk full, file-size limit, permission) an IoError
// naming the path and errno's reason.
#pragma once

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace stepcast {

void write_file_atomic(const std::filesystem::path& path, const std::string& text);

// Several files, all or none: each is written to its temporary first, and only when all are
// written are they renamed into place. The same path named twice is an InputError.
void write_files_atomic(const std::vector<std::pair<std::filesystem::path, std::string>>& files);

// Throws InputError unless `path` could be written by write_file_atomic: its folder
// exists and it is not a folder (checked before long work, so that it fails first).
void check_output_path(const std::filesystem::path& path);

// Appends `lines` (each ending in '\n') to `path` with one write(2), creating the file.
void append_lines(const std::filesystem::path& path, const std::string& lines);

// Removes a file or a folder and everything under it (links are removed, not followed);
// no error when it does not exist. Not std::filesystem::remove_all: the torch wheel's
// libtorch.so on the GPU machine exports its own copy of that function, the dynamic linker
// binds our calls to it, and it jumps to a null pointer on a non-empty folder (seen with
// cuda-gdb: frame 1 std::filesystem::remove_all in libtorch.so).
void remove_tree(const std::filesystem::path& path);

// Makes a rename or creation inside `folder` durable (fsync of the folder).
void sync_folder(const std::filesystem::path& folder);

}  // namespace stepcast
