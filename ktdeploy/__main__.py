from ktdeploy.cli import main

main()
